"""The embed options of contract 1.1 against the served model (CONTRACT.md §Additions in 1.1).

Pure (no torch, no I/O). Two steps per request:

1. at admission, :func:`admit_options` checks ``dimensions`` / ``prompt_name`` / any embed
   option against the :class:`ModelProfile` (``invalid_option`` when the model cannot do it) and
   says which prompt the input gets — the prompt is prepended to the text before tokenizing, so
   the token budget, buckets, truncation and ``input_too_long`` all count prompt + text;
2. at reply time, :func:`shape_result` derives the request's ``result`` from the runner's
   result (which carries the full pooled, un-normalised vector as ``pooled``): the first
   ``dimensions`` values, normalised as asked, in the asked ``encoding_format``. The same
   computation serves every copy of a key with the same prompt, whatever its other options.

Type and set errors (``dimensions: "8"``) never get here: the codec answers them
``invalid_request``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar, Self

from schemas.embedding import embedding_result
from schemas.models import EMBED_OPTIONS, EncodingFormat, Task

__all__ = [
    "EmbedOptions",
    "ModelProfile",
    "OptionError",
    "RequestOptions",
    "admit_options",
    "dedup_key",
    "shape_result",
]

POOLED: str = "pooled"
"""Key of the runner's embed result holding the full pooled, un-normalised ``(H,)`` float32
vector (not part of the contract; reply building leaves it out)."""


class OptionError(ValueError):
    """A well-formed option this model cannot honour: the ``invalid_option`` reply's message."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What the served model offers to the options.

    Attributes:
        task: the served task (:data:`schemas.models.Task`).
        dim: the pooled embedding's dimension (embed), None when unknown.
        normalizes: whether the model's sentence-transformers config has a ``Normalize`` module
            (the default of ``normalize``).
        prompts: prompt name → prompt text (``config_sentence_transformers.json``).
        default_prompt_name: the prompt a request without ``prompt_name`` gets: the server's
            ``--default-prompt-name``, else the model's ``default_prompt_name``, else None.
    """

    task: Task = "embed"
    dim: int | None = None
    normalizes: bool = False
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    def __post_init__(self) -> None:
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(
                f"default prompt name {self.default_prompt_name!r} is not one of the model's "
                f"prompts {sorted(self.prompts)}"
            )


class RequestOptions:
    """Base of a frozen dataclass of options named as :class:`~schemas.models.Request` fields."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @classmethod
    def of(cls, source: object) -> Self:
        """The options ``source`` carries: each field read from the attribute of that name (a
        :class:`~schemas.models.Request`, or ``kbatch backfill``'s settings)."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class EmbedOptions(RequestOptions):
    """The four embed options of one request (None: absent); its fields are
    :data:`schemas.models.EMBED_OPTIONS`, in that order."""

    dimensions: int | None = None
    normalize: bool | None = None
    prompt_name: str | None = None
    encoding_format: EncodingFormat | None = None

    @property
    def any_set(self) -> bool:
        """Whether any option is given, even with its default value."""
        return any(getattr(self, name) is not None for name in EMBED_OPTIONS)


def admit_options(options: EmbedOptions, profile: ModelProfile) -> str | None:
    """Check ``options`` against the model; the name of the prompt the input gets, or None.

    Raises:
        OptionError: an embed option on a classify model (even with its default value),
            ``dimensions`` above the model's dimension, or an unknown ``prompt_name``.
    """
    if profile.task == "classify":
        if options.any_set:
            raise OptionError(
                f"{', '.join(EMBED_OPTIONS[:-1])} and {EMBED_OPTIONS[-1]} are embed options; "
                "this model classifies"
            )
        return None
    dims = options.dimensions
    if dims is not None and profile.dim is not None and dims > profile.dim:
        raise OptionError(f"dimensions is {dims}; this model's embeddings have {profile.dim}")
    name = options.prompt_name if options.prompt_name is not None else profile.default_prompt_name
    if name is not None and name not in profile.prompts:
        known = ", ".join(sorted(profile.prompts)) or "none"
        raise OptionError(f"unknown prompt_name {name[:100]!r}; this model's prompts: {known}")
    return name


def prompted_text(text: str, prompt_name: str | None, profile: ModelProfile) -> str:
    """``text`` with the named prompt prepended (as sentence-transformers does)."""
    return text if prompt_name is None else profile.prompts[prompt_name] + text


def dedup_key(key: bytes, prompt_name: str | None, max_key_bytes: int = 256) -> bytes:
    """The dedup cache's key: copies share a computation only when the model saw the same
    input, i.e. the same key and the same prompt.

    ``key`` itself without a prompt (1.0 behaviour); with one, the key padded to
    ``max_key_bytes + 1`` bytes, its length and the prompt name — longer than any record key,
    so it never equals one, and distinct keys or names never meet.
    """
    if prompt_name is None:
        return key
    return key.ljust(max_key_bytes + 1, b"\0") + len(key).to_bytes(2, "big") + prompt_name.encode()


def shape_result(
    result: Mapping[str, Any], options: EmbedOptions, profile: ModelProfile
) -> Mapping[str, Any]:
    """The ``result`` map for ``options`` from the runner's ``result``.

    Unchanged when no shaping is asked (no ``dimensions``, ``normalize`` absent or the model's
    own, ``float``) or for a classification; else derived from ``result["pooled"]`` (the full
    un-normalised vector; the ``embedding`` itself when absent): first ``dimensions`` values,
    L2-normalised when ``normalize`` (absent: the model's ``Normalize``), then encoded.
    """
    if "embedding" not in result:
        return result
    fmt = options.encoding_format or "float"
    normalize = profile.normalizes if options.normalize is None else options.normalize
    if options.dimensions is None and normalize == profile.normalizes and fmt == "float":
        return result
    pooled = result.get(POOLED)
    if pooled is None:
        pooled = result["embedding"]
    return embedding_result(
        pooled, dimensions=options.dimensions, normalize=normalize, encoding_format=fmt
    )
