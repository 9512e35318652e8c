"""The ONNX Runtime backend (``--backend onnx``): the same model exported once to ONNX and run
by an ORT CPU session, behind the same :class:`~consumer.model.torch_backend.TorchBackend`.

The ORT session stands in for the transformers network only (:class:`OrtNetwork`, a
``torch.nn.Module`` whose ``forward`` runs the session): collation, pooling, normalisation and
the reply maps stay :class:`TorchBackend`'s, so the two backends answer in the same shape and
every option applied there applies here too.

- **Export** (:func:`ensure_onnx`): the model loaded with ``attn_implementation="eager"``,
  exported by the TorchScript exporter (``torch.onnx.export(dynamo=False)``, opset 17) with
  dynamic batch and sequence axes, then rewritten by ORT's transformer optimizer
  (:func:`fuse_transformer`: fused ``EmbedLayerNormalization``, ``Attention``,
  ``SkipLayerNormalization``, ``BiasGelu``; 9–20 % less CPU per text than the unfused graph on
  MiniLM). Neither the dynamo exporter's graph nor a TorchScript export of transformers'
  ``sdpa`` attention matches the optimizer's attention pattern (LayerNorm and GELU fuse,
  attention stays MatMul/Softmax); a wrong export answers single texts right and padded rows
  wrong, so the tests run padded mixed-length batches through the fused graph against torch,
  and the same text alone against padded. Inputs ``input_ids`` /
  ``attention_mask`` ``(n, L)`` int64, output ``last_hidden_state`` ``(n, L, H)`` (embed) or
  ``logits`` ``(n, C)`` (classify), float32.
- **Cache**: ``$KBATCH_CACHE_DIR/onnx/<key>/model.onnx`` (default ``~/.cache/kbatch``), where
  ``<key>`` hashes the model directory's files (weights and configs), the task, the
  quantisation, the export/fusion/quantisation recipe (``_FP32_RECIPE``, ``_INT8_RECIPE``) and
  the versions of torch, transformers, onnx, onnxscript and onnxruntime: a new model, recipe or
  library exports again, nothing else does. Written to a temporary directory and
  renamed, so a crash never leaves half a model there.
- **int8** (``--quantize int8``): ORT dynamic quantisation (weights int8, activations quantised
  per batch) of the fp32 export, cached under its own key. Lossy: the start-up quality gate
  (:mod:`consumer.model.quality`) measures it.
- **Threads** (:func:`session_options`): ``intra_op`` = the torch thread count, ``inter_op`` 1,
  sequential execution and no spin-waiting (``session.intra_op.allow_spinning=0``): an idle ORT
  pool must not take the cores the event loop and the tokenizer thread need (measured: a serve
  drain with spinning on ran 0.43× torch against 0.67× with it off, same run).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from consumer.model.protocol import Quantize, Task

__all__ = [
    "OrtNetwork",
    "cache_key",
    "ensure_onnx",
    "export_onnx",
    "fuse_transformer",
    "onnx_cache_dir",
    "session_options",
]

log = logging.getLogger(__name__)

_FORMAT = "kbatch-onnx-1"  # bump when the exported graph's inputs/outputs change
# What export_onnx + fuse_transformer do (exporter, attention implementation, fusion) and what
# _quantize_int8 does: part of the key, so a changed recipe never reuses an old cached file.
_FP32_RECIPE = "torchscript-eager-opset17+ort-bert-fusion"
_INT8_RECIPE = "dynamic-qint8-per-channel-matmul"
_OPSET = 17
_LIBRARIES = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime")
_MODEL_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model")


def onnx_cache_dir() -> Path:
    """Where exports live: ``$KBATCH_CACHE_DIR/onnx`` (default ``~/.cache/kbatch/onnx``)."""
    root = Path(os.environ.get("KBATCH_CACHE_DIR", Path.home() / ".cache" / "kbatch"))
    return root / "onnx"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def cache_key(model_dir: Path, task: Task, quantize: Quantize) -> str:
    """A 24-hex-digit key of one export: sha256 over the model directory's top-level files
    (name and bytes of every ``*.json``, ``*.safetensors``, ``*.bin``, ``*.txt``, ``*.model``
    and of the sentence-transformers module configs), the task, the quantisation, the export
    format, the export/fusion/quantisation recipe and the library versions."""
    h = hashlib.sha256()
    recipe = (_FP32_RECIPE, _INT8_RECIPE) if quantize == "int8" else (_FP32_RECIPE,)
    for part in (_FORMAT, task, quantize, *recipe, *(f"{n}={_version(n)}" for n in _LIBRARIES)):
        h.update(part.encode() + b"\0")
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.suffix in _MODEL_SUFFIXES)
    for p in files:
        h.update(str(p.relative_to(model_dir)).encode() + b"\0")
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:24]


class _Network(torch.nn.Module):
    """The transformers model as ``(input_ids, attention_mask) → tensor`` for the exporter."""

    def __init__(self, model: torch.nn.Module, task: Task) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        result: torch.Tensor = out.logits if self.task == "classify" else out.last_hidden_state
        return result


def output_name(task: Task) -> str:
    """The exported graph's output: ``logits`` (classify) or ``last_hidden_state`` (embed)."""
    return "logits" if task == "classify" else "last_hidden_state"


def export_onnx(model: torch.nn.Module, task: Task, target: Path) -> None:
    """Export an eval-mode transformers ``model`` (loaded with ``attn_implementation="eager"``)
    to ``target`` (one ``.onnx`` file) with dynamic batch and sequence axes (inputs and outputs:
    the module docstring), by the TorchScript exporter (``dynamo=False``): its graph writes
    attention as the MatMul/Softmax pattern ORT's transformer optimizer fuses
    (:func:`fuse_transformer`); the dynamo exporter's does not match it.

    Raises:
        Exception: the exporter's error, unchanged (the model does not export).
    """
    example = torch.full((2, 8), 1000, dtype=torch.int64)
    mask = torch.ones((2, 8), dtype=torch.int64)
    mask[1, 5:] = 0  # a padded row in the example, so no path assumes a full mask
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecation/tracer warnings
        torch.onnx.export(
            _Network(model, task).eval(),
            (example, mask),
            str(target),
            input_names=["input_ids", "attention_mask"],
            output_names=[output_name(task)],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                output_name(task): axes if task == "embed" else {0: "batch"},
            },
            opset_version=_OPSET,
            dynamo=False,
        )


def fuse_transformer(source: Path, target: Path, config: Any) -> dict[str, int]:
    """Rewrite ``source`` with ORT's transformer optimizer (``optimize_model``, model type
    ``bert``: EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu fused
    operators) into ``target``; heads and hidden size come from the transformers ``config``.
    A graph whose patterns do not match stays as it was (still correct, only not fused).

    Returns:
        the fused operator counts (operator → count, zeros left out), as the log reports them.
    """
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        str(source),
        model_type="bert",
        num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
        hidden_size=int(getattr(config, "hidden_size", 0) or 0),
        opt_level=0,  # the fusions only; the session applies ORT's own optimisations at load
        use_gpu=False,
    )
    optimized.save_model_to_file(str(target))
    stats = optimized.get_fused_operator_statistics()
    return {op: int(n) for op, n in stats.items() if n}


def _quantize_int8(source: Path, target: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Per-channel weight scales on the MatMuls only: on MiniLM the probe set's min cosine is
    # 0.956 this way against 0.82 for ORT's per-tensor default (both below the gate's 0.99).
    # The fused Attention operators keep their Q/K/V projections in fp32 (only MatMul nodes are
    # quantised): min cosine 0.982 on the fused graph against 0.973 on the unfused one.
    # DefaultTensorType: shape inference cannot type the fused (com.microsoft) operators' outputs.
    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def ensure_onnx(model_dir: Path, task: Task, quantize: Quantize = "none") -> Path:
    """The cached ONNX file of ``model_dir`` for ``task`` and ``quantize``, exported (and
    quantised) on first use; see the module docstring for the cache layout and key.

    Raises:
        OSError: the cache directory is not writable.
        Exception: the exporter's or the quantiser's error, unchanged.
    """
    key = cache_key(model_dir, task, quantize)
    final = onnx_cache_dir() / key
    path = final / "model.onnx"
    if path.is_file():
        return path
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
    try:
        if quantize == "int8":
            fp32 = ensure_onnx(model_dir, task, "none")
            log.info("quantising %s to int8 (ORT dynamic) into %s", fp32, final)
            _quantize_int8(fp32, tmp / "model.onnx")
        else:
            from transformers import AutoModel, AutoModelForSequenceClassification

            log.info("exporting %s (%s) to ONNX into %s", model_dir, task, final)
            cls = AutoModelForSequenceClassification if task == "classify" else AutoModel
            model = cls.from_pretrained(str(model_dir), attn_implementation="eager").eval()
            export_onnx(model, task, tmp / "unfused.onnx")
            fused = fuse_transformer(tmp / "unfused.onnx", tmp / "model.onnx", model.config)
            (tmp / "unfused.onnx").unlink()
            log.info("ORT transformer fusions: %s", fused or "none matched")
        try:
            tmp.rename(final)
        except OSError:  # another process won the race: use its export
            if not path.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def session_options(threads: int) -> Any:
    """ORT session options for a CPU server: ``threads`` intra-op threads, one inter-op
    thread, sequential execution, every graph optimisation, no spin-waiting."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


class OrtNetwork(torch.nn.Module):
    """An ONNX Runtime session in place of the transformers network.

    ``forward(input_ids=(n, L) int64, attention_mask=(n, L) int64)`` returns an object with
    ``last_hidden_state`` ``(n, L, H)`` (embed) or ``logits`` ``(n, C)`` (classify), float32
    CPU tensors, exactly what :class:`~consumer.model.torch_backend.TorchBackend` reads from a
    transformers model. ``config`` is the model's transformers config (labels, pad id).

    Args:
        path: the ``.onnx`` file (:func:`ensure_onnx`).
        task: ``embed`` or ``classify``.
        config: the transformers ``PretrainedConfig``.
        threads: ORT intra-op threads.
    """

    def __init__(self, path: Path, task: Task, config: Any, threads: int) -> None:
        super().__init__()
        import onnxruntime as ort

        self.path = path
        self.task: Task = task
        self.config = config
        self.session = ort.InferenceSession(
            str(path), sess_options=session_options(threads), providers=["CPUExecutionProvider"]
        )
        self._output = output_name(task)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        """Run the session on one padded batch (see the class docstring)."""
        feeds = {
            "input_ids": np.ascontiguousarray(input_ids.numpy()),
            "attention_mask": np.ascontiguousarray(attention_mask.numpy()),
        }
        (out,) = self.session.run([self._output], feeds)
        return SimpleNamespace(**{self._output: torch.from_numpy(out)})
