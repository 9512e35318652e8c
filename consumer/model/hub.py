"""``--model ORG/NAME[@REVISION]``: a Hugging Face Hub model id, resolved to a cached snapshot.

:func:`resolve_hub_model` asks ``huggingface_hub`` (``snapshot_download``) in this order:

1. its cache (``HF_HUB_CACHE``, default ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``): a
   snapshot already there is used as it is, without a network round trip — so restarts and
   replicas never depend on the hub (``hf download ID`` refreshes a branch's snapshot);
2. the hub (``HF_ENDPOINT``; a token from ``HF_TOKEN`` for gated or private models), unless
   ``HF_HUB_OFFLINE=1``: the files kbatch loads are downloaded into that cache.

Only what kbatch loads is fetched: configs, tokenizer files and ``*.safetensors`` weights
(``pytorch_model.bin`` when the model has no safetensors); not the ONNX, OpenVINO, TF or Flax
copies a repository may hold. A revision (a branch, a tag or a commit) comes from ``ID@REV`` or
``--model-revision``; replies report the snapshot's commit.

Everything here is a ``ModelNotFoundError`` (a ``FileNotFoundError``) with one line saying
what to do. ``huggingface_hub`` is imported inside :func:`resolve_hub_model` only.
"""

from __future__ import annotations

import re
from pathlib import Path

from consumer.model.errors import ModelNotFoundError

__all__ = ["HUB_ID", "WEIGHT_PATTERNS", "parse_hub_id", "resolve_hub_model"]

HUB_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?)(?:@(?P<rev>[\w./-]+))?$"
)
"""``NAME`` or ``ORG/NAME``, optionally ``@REVISION`` (the hub's repository id rules)."""

_FILES = ["*.json", "*.txt", "*.model", "*.tiktoken"]
"""Configs (also ``1_Pooling/config.json``), vocabularies, sentencepiece models."""

WEIGHT_PATTERNS = ([*_FILES, "*.safetensors"], [*_FILES, "pytorch_model*.bin"])
"""What is fetched: safetensors weights when there are any, else PyTorch's ``.bin``."""


def parse_hub_id(model: str, revision: str | None) -> tuple[str, str | None] | None:
    """``(repo id, revision)`` when ``model`` reads as a hub id (``ORG/NAME[@REV]``), else None.

    Raises:
        ValueError: ``@REV`` and ``--model-revision`` both given and different.
    """
    match = HUB_ID.match(model)
    if match is None or model.startswith((".", "~")):
        return None
    pinned = match["rev"]
    if pinned and revision and pinned != revision:
        raise ValueError(
            f"--model {model} pins revision {pinned}, --model-revision says {revision}: give one"
        )
    return match["repo"], pinned or revision


def resolve_hub_model(repo_id: str, revision: str | None) -> tuple[Path, str]:
    """The local snapshot directory of ``repo_id`` at ``revision`` (None: ``main``) and its
    commit hash: from the cache, else downloaded (module docstring).

    Raises:
        ModelNotFoundError: neither cached nor downloadable; the message says why and what to do.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"--model {repo_id}" + (f"@{revision}" if revision else "")
    cache = constants.HF_HUB_CACHE
    folder: str | None = None
    bare: str | None = None  # a snapshot found without weights
    error: Exception | None = None
    for offline in (True, False):
        if not offline and constants.HF_HUB_OFFLINE:
            break
        for patterns in WEIGHT_PATTERNS:
            try:
                found = snapshot_download(
                    repo_id, revision=revision, allow_patterns=patterns, local_files_only=offline
                )
            except GatedRepoError:
                raise ModelNotFoundError(
                    f"{what}: a gated or private model; accept its terms on the hub and set "
                    "HF_TOKEN (or run `hf auth login`)"
                ) from None
            except RepositoryNotFoundError:
                raise ModelNotFoundError(
                    f"{what}: no such model on the hub (nor a local directory of that name); "
                    "a private one needs HF_TOKEN"
                ) from None
            except RevisionNotFoundError:
                raise ModelNotFoundError(
                    f"{what}: the hub has no revision {revision} of {repo_id}"
                ) from None
            except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
                error = err
                continue
            if _has_weights(Path(str(found))):
                folder = str(found)
                break
            bare = str(found)
        if folder is not None:
            break
    if folder is None and bare is not None and (error is None or constants.HF_HUB_OFFLINE):
        raise ModelNotFoundError(
            f"{what}: {bare} holds no *.safetensors or pytorch_model*.bin weights (a model "
            "kbatch cannot load: ONNX-only or another library's format)"
        )
    if folder is None:
        if constants.HF_HUB_OFFLINE:
            why = "HF_HUB_OFFLINE=1"
        else:
            cause = error and (error.__cause__ or error)
            why = f"the hub is unreachable ({type(cause).__name__})" if cause else "no weights"
        raise ModelNotFoundError(
            f"{what}: not in the Hugging Face cache ({cache}) and {why}: run `hf download "
            f"{repo_id}` where the hub is reachable and copy that cache here (HF_HOME), or "
            "give a local save_pretrained directory"
        )
    path = Path(folder)
    return path, path.name


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
