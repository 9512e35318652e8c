"""A model's named prompts (sentence-transformers' ``config_sentence_transformers.json``).

No torch here: ``kbatch serve`` and ``kbatch backfill`` check ``--default-prompt-name`` before
anything loads.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PROMPTS_FILE", "read_prompts", "resolve_default_prompt"]

PROMPTS_FILE = "config_sentence_transformers.json"


def read_prompts(model_dir: Path) -> tuple[dict[str, str], str | None]:
    """The model's prompts (name → text) and its ``default_prompt_name`` from
    ``config_sentence_transformers.json``; ``({}, None)`` when the file is absent.

    Raises:
        ValueError: ``prompts`` is not a map of strings, or ``default_prompt_name`` is not one
            of them.
    """
    path = model_dir / PROMPTS_FILE
    if not path.is_file():
        return {}, None
    config = json.loads(path.read_text())
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ValueError(f"{path}: prompts must map names to strings")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"{path}: default_prompt_name {default!r} is not one of {sorted(prompts)}")
    return dict(prompts), default


def resolve_default_prompt(
    model_dir: Path, task: str, server_default: str | None
) -> tuple[dict[str, str], str | None]:
    """The prompts and the default prompt name a server uses: ``server_default``
    (``--default-prompt-name``) when given, else the model's own ``default_prompt_name``, else
    None (CONTRACT.md §Additions in 1.1).

    Raises:
        ValueError: ``server_default`` is not one of the model's prompts, or is given for a
            classify model (prompts are for embeddings); the file is malformed.
    """
    prompts, model_default = read_prompts(model_dir)
    if task == "classify":
        if server_default is not None:
            raise ValueError("--default-prompt-name applies to embed models; this one classifies")
        return prompts, None
    if server_default is not None and server_default not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise ValueError(
            f"--default-prompt-name {server_default!r} is not one of the model's prompts ({known})"
        )
    return prompts, server_default if server_default is not None else model_default
