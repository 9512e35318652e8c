"""A model directory's maximum input length, read from its JSON files (no torch, no
transformers: cheap enough for the start-up checks)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["check_model_files", "read_max_length"]

_UNBOUNDED = 1_000_000  # transformers' "no limit" model_max_length is ~1e30

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
"""The weight files transformers' ``from_pretrained`` loads (a sharded model's too)."""


def check_model_files(model_dir: Path) -> None:
    """The files a model load needs are there and readable: every JSON file at the top of
    ``model_dir`` parses, and a weights file exists (:data:`WEIGHT_PATTERNS`).

    Raises:
        ValueError: a JSON file that is not JSON (the message names it and where it breaks), or
            no weights file (the message names the patterns looked for).
    """
    for path in sorted(model_dir.glob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not any(next(model_dir.glob(p), None) for p in WEIGHT_PATTERNS):
        raise ValueError(
            f"{model_dir}: no model weights (model.safetensors or pytorch_model.bin): "
            "a directory written by save_pretrained has them"
        )


def read_max_length(model_dir: Path) -> int:
    """The model's maximum input length in tokens, special tokens included.

    The smallest of: ``sentence_bert_config.json``'s ``max_seq_length`` (256 for MiniLM),
    ``tokenizer_config.json``'s ``model_max_length`` and ``config.json``'s
    ``max_position_embeddings`` (minus 2 for RoBERTa-style position offsets). Raises
    ``ValueError`` when none is found.
    """
    found: list[int] = []

    def read(name: str) -> dict[str, object]:
        p = model_dir / name
        return json.loads(p.read_text()) if p.is_file() else {}

    sbert = read("sentence_bert_config.json").get("max_seq_length")
    if isinstance(sbert, int) and sbert > 0:
        found.append(sbert)
    tok_max = read("tokenizer_config.json").get("model_max_length")
    if isinstance(tok_max, int | float) and 0 < tok_max < _UNBOUNDED:
        found.append(int(tok_max))
    cfg = read("config.json")
    pos = cfg.get("max_position_embeddings")
    if isinstance(pos, int) and pos > 0:
        offset = 2 if cfg.get("model_type") in {"roberta", "xlm-roberta", "camembert"} else 0
        found.append(pos - offset)
    if not found:
        raise ValueError(f"{model_dir}: cannot tell the model's maximum length")
    return min(found)
