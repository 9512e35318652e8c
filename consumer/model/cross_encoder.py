"""Which activation ``CrossEncoder.predict`` applies to a cross-encoder's logit (no torch
unless a saved path is an unusual spelling).

The rules are sentence-transformers' own (6.2.0, the version ``requirements.lock`` pins), read
from its source; ``tests/unit/test_cross_encoder_activation.py`` holds kbatch to
``CrossEncoder(dir).predict`` of the installed version on every layout below:

1. **``config_sentence_transformers.json``** (what ``CrossEncoder.save`` writes since 5.0, as
   ``activation_fn``): read only when the directory also has ``modules.json`` and the file's
   ``model_type`` is ``CrossEncoder`` (``BaseModel._load_modules``: another or no model type is
   "converted" and the file is not parsed); used when it is a string (``_parse_model_config``).
2. **``config.json``**, when step 1 gave nothing (``get_default_activation_fn``): the
   ``sentence_transformers.activation_fn`` entry (4.x) when that key exists, even null; else
   the pre-4.0 ``sbert_ce_default_activation_function`` when not null.
3. A path found is used only when it starts with ``torch.`` (``_resolve_activation_fn`` without
   ``trust_remote_code``, which kbatch never sets); another path is ignored with a warning, as
   sentence-transformers does: from step 1 the search goes on with step 2, from step 2 to the
   default.
4. **Default**: Sigmoid for one label, else Identity.

kbatch applies Sigmoid and Identity; any other activation a model names is refused at
start-up (:func:`read_activation` raises, ``kbatch serve``/``backfill`` print one line).
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["Activation", "ResolvedActivation", "read_activation", "resolve_activation"]

log = logging.getLogger(__name__)

Activation = Literal["sigmoid", "identity"]

ST_CONFIG = "config_sentence_transformers.json"
"""The model-level file of sentence-transformers 5+ (``BaseModel.save``)."""

_KNOWN: dict[str, Activation] = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",  # what ``fullname(nn.Sigmoid())`` writes
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",  # ``fullname(nn.Identity())``
    "torch.nn.Identity": "identity",
}


@dataclass(frozen=True, slots=True)
class ResolvedActivation:
    """The activation ``CrossEncoder`` would apply and where it was found.

    Attributes:
        path: the dotted path (the default's: ``torch.nn.Sigmoid`` or ``torch.nn.Identity``).
        source: the file and key it came from, or ``default (N labels)``.
    """

    path: str
    source: str


def resolve_activation(model_dir: Path) -> ResolvedActivation:
    """The activation path ``CrossEncoder(model_dir)`` (sentence-transformers 6.2.0, without
    ``trust_remote_code``) loads, by the rules of the module docstring. Logs a warning for a
    path it ignores.

    Raises:
        OSError: ``config.json`` cannot be read; ValueError: a file is not JSON.
    """
    for path, source in _candidates(model_dir):
        if not isinstance(path, str):
            break
        if path.startswith("torch."):
            return ResolvedActivation(path, source)
        log.warning(
            "%s: cross-encoder activation %s (%s) ignored, as sentence-transformers ignores an "
            "activation outside torch without trust_remote_code",
            model_dir,
            path,
            source,
        )
    cfg = _read_json(model_dir / "config.json")
    # transformers' PretrainedConfig: len(id2label) when given, else num_labels, else 2
    labels = (
        len(cfg["id2label"]) if isinstance(cfg.get("id2label"), dict) else cfg.get("num_labels", 2)
    )
    if labels == 1:
        return ResolvedActivation("torch.nn.Sigmoid", "default (one label)")
    return ResolvedActivation("torch.nn.Identity", f"default ({labels} labels)")


def read_activation(model_dir: Path) -> Activation:
    """What kbatch applies to the rerank logit of ``model_dir``: :func:`resolve_activation`,
    which must be Sigmoid or Identity.

    Raises:
        ValueError: another activation (one line naming it, its file and what kbatch applies),
            or a path that does not import; OSError: ``config.json`` cannot be read.
    """
    found = resolve_activation(model_dir)
    activation = _KNOWN.get(found.path) or _imported(found.path)
    if activation is None:
        raise ValueError(
            f"{model_dir}: the cross-encoder's activation is {found.path} ({found.source}); "
            "kbatch applies only torch.nn.Sigmoid and torch.nn.Identity to a rerank score"
        )
    return activation


def _candidates(model_dir: Path) -> list[tuple[object, str]]:
    """The saved activation paths in sentence-transformers' order; an entry that is not a
    string ends the search at the default (a ``config.json`` key present but null)."""
    out: list[tuple[object, str]] = []
    st_path = model_dir / ST_CONFIG
    if (model_dir / "modules.json").is_file() and st_path.is_file():
        st = _read_json(st_path)
        is_cross_encoder = st.get("model_type", "SentenceTransformer") == "CrossEncoder"
        if is_cross_encoder and isinstance(st.get("activation_fn"), str):
            out.append((st["activation_fn"], f"{ST_CONFIG} activation_fn"))
    cfg = _read_json(model_dir / "config.json")
    block = cfg.get("sentence_transformers")
    if isinstance(block, dict) and "activation_fn" in block:
        out.append((block["activation_fn"], "config.json sentence_transformers.activation_fn"))
    elif cfg.get("sbert_ce_default_activation_function") is not None:
        out.append(
            (cfg["sbert_ce_default_activation_function"], "config.json "
             "sbert_ce_default_activation_function")
        )  # fmt: skip
    out.append((None, "default"))
    return out


def _imported(path: str) -> Activation | None:
    """Sigmoid or Identity when ``path`` imports as one of them (another spelling of the same
    class, as sentence-transformers' ``import_from_string`` resolves it); else None."""
    import torch

    module_name, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None
    if found is torch.nn.Sigmoid:
        return "sigmoid"
    if found is torch.nn.Identity:
        return "identity"
    return None


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
