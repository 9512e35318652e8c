"""The torch backend: ``embed`` and ``classify`` on CUDA or CPU (the only torch importer with
``consumer.model.tokenize``).

- ``embed``: ``AutoModel`` + the pooling the model's sentence-transformers config asks for
  (``modules.json`` → ``1_Pooling/config.json``: cls / mean / max / mean-sqrt-len; a
  ``Normalize`` module adds L2 normalisation — MiniLM: mean + normalise); without that config,
  mean pooling and no normalisation (CONTRACT.md §Reply record). Each result also carries the
  full pooled vector before normalisation (``pooled``, float32 numpy), from which replies derive
  the options of contract 1.1 (``dimensions``, ``normalize``, ``encoding_format``).
- ``classify``: ``AutoModelForSequenceClassification``, softmax over ``config.id2label``.

Every forward runs under ``torch.inference_mode`` with an attention mask, so padding never
changes an answer. On CUDA: bf16/fp16 weights and autocast (``--dtype``; the start-up quality
gate checks them against fp32). On the CPU: bf16 autocast with fp32 weights (``--dtype
bfloat16``: oneDNN's bf16 matrix multiplies, AMX or AVX512-BF16 where the CPU has them) for
batches of at least :data:`CPU_BF16_MIN_PADDED_TOKENS` padded tokens: smaller ones run fp32,
which is faster there (BENCHMARKS.md: 0.5–0.9× below ~100 tokens, 1.5–3.4× for full batches
on an AMX Xeon). On
CUDA also reused pinned host buffers (:class:`_PinnedStaging`),
non-blocking copies, and collation one batch ahead (``prefetch``). Results are float32 on the host.
An out-of-memory error leaves :meth:`TorchBackend.forward` and :meth:`TorchBackend.warmup` as
:class:`consumer.model.errors.DeviceOutOfMemoryError`.

Loading a model directory into a runner: :func:`consumer.model.loader.load_runner`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from consumer.batching.types import TokenizedItem
from consumer.model.batch_runner import ModelRunner
from consumer.model.errors import is_out_of_memory, map_device_errors
from consumer.model.protocol import AutocastName, Task
from consumer.model.traced import TracedNetwork, trace_network

__all__ = [
    "Pooling",
    "TorchBackend",
    "configure_threads",
    "default_device",
    "describe_runner",
    "read_pooling",
]

log = logging.getLogger(__name__)

PoolingMode = Literal["mean", "cls", "max", "mean_sqrt_len"]


@dataclass(frozen=True, slots=True)
class Pooling:
    """How token states become one embedding: ``mode`` and whether to L2-normalise."""

    mode: PoolingMode = "mean"
    normalize: bool = False


def read_pooling(model_dir: Path) -> Pooling:
    """The pooling a sentence-transformers model directory asks for.

    Reads ``modules.json``; its ``Pooling`` module's ``config.json`` chooses the mode (the
    first true of ``pooling_mode_cls_token``, ``_max_tokens``, ``_mean_sqrt_len_tokens``,
    ``_mean_tokens``); a ``Normalize`` module turns on L2 normalisation. Without
    ``modules.json`` (a plain transformers model): mean pooling, no normalisation. Modes this
    backend does not implement fall back to mean with a warning.
    """
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return Pooling()
    modules = json.loads(modules_path.read_text())
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    mode: PoolingMode = "mean"
    for m in modules:
        if not str(m.get("type", "")).endswith(".Pooling"):
            continue
        cfg_path = model_dir / str(m.get("path", "")) / "config.json"
        if not cfg_path.is_file():
            break
        cfg = json.loads(cfg_path.read_text())
        chosen = [
            name
            for key, name in (
                ("pooling_mode_cls_token", "cls"),
                ("pooling_mode_max_tokens", "max"),
                ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
                ("pooling_mode_mean_tokens", "mean"),
            )
            if cfg.get(key)
        ]
        other = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
        if chosen:
            mode = chosen[0]  # type: ignore[assignment]
        elif other:
            log.warning("pooling %s not supported: using mean pooling", other)
        if len(chosen) > 1:
            log.warning("several pooling modes %s: using %s only", chosen, mode)
    unknown = [
        m.get("type")
        for m in modules
        if not str(m.get("type", "")).endswith((".Transformer", ".Pooling", ".Normalize"))
    ]
    if unknown:
        log.warning("sentence-transformers modules %s are not applied", unknown)
    return Pooling(mode=mode, normalize=normalize)


def default_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def allocated_bytes(device: str) -> int:
    """Bytes of CUDA memory torch holds for tensors on ``device`` now (0 on the CPU)."""
    if not device.startswith("cuda"):
        return 0
    return int(torch.cuda.memory_allocated(device))


def configure_threads(intra_op_threads: int, interop_threads: int = 1) -> int:
    """Set torch's intra-op and inter-op thread counts (from the process's
    :class:`consumer.cpu.plan.ThreadPlan`); returns the intra-op count torch reports. Call once,
    before the first model runs.

    Torch's own default is one intra-op thread per core of the *node*: in a container with a CPU
    limit that oversubscribes the quota (docs/CPU.md). Inter-op threads can only be set before
    torch's first parallel work; a later call keeps the count already set.
    """
    torch.set_num_threads(max(1, intra_op_threads))
    with contextlib.suppress(RuntimeError):  # already set, or parallel work already started
        torch.set_num_interop_threads(max(1, interop_threads))
    return int(torch.get_num_threads())


class _PinnedStaging:
    """Reusable pinned host buffers for host→device copies on CUDA, used in turn.

    ``Tensor.pin_memory()`` per batch allocates page-locked memory each time (a
    ``cudaHostAlloc``, slower than the copy it serves); here ``slots`` buffers grow to the
    largest batch seen and are reused. A buffer is rewritten only after the copy that last
    read it has finished (a CUDA event per buffer), so a batch prepared one ahead never
    overwrites one still in flight. One batch's ids and mask travel in one ``(2, n, L)`` copy.
    """

    def __init__(self, device: torch.device, slots: int = 3) -> None:
        self.device = device
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list[Any] = [None] * slots
        self._next = 0
        self._lock = threading.Lock()

    def to_device(self, a: np.ndarray[Any, Any]) -> torch.Tensor:
        """Copy int64 ``a`` to the device without blocking; returns the device tensor."""
        with self._lock:
            k = self._next
            self._next = (k + 1) % len(self._buffers)
        event = self._events[k]
        if event is not None:
            event.synchronize()  # the previous copy out of this buffer is done
        buf = self._buffers[k]
        if buf is None or buf.numel() < a.size:
            buf = torch.empty(max(a.size, 2 * (buf.numel() if buf is not None else 0)),
                              dtype=torch.int64, pin_memory=True)  # fmt: skip
            self._buffers[k] = buf
        staged = buf[: a.size].view(a.shape)
        staged.numpy()[...] = a
        out = staged.to(self.device, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        self._events[k] = event
        return out


CPU_BF16_MIN_PADDED_TOKENS = 128
"""On the CPU, bf16 autocast only for batches of at least this many padded tokens (rows ×
padded length). Measured on MiniLM, 2 threads of an AMX Xeon, bf16 time / fp32 time: 1.9 at
1 × 8, 1.3 at 1 × 16 and 1 × 32, 1.15–1.2 at 64 tokens, 0.87 at 4 × 32 = 128, 0.68 at 8 × 16,
0.3 at 32 × 64 (for a tiny batch, casting costs more than the bf16 matrix multiply saves)."""


@dataclass(slots=True)
class _Prepared:
    ids: torch.Tensor  # (n, padded_len) int64, on the device
    mask: torch.Tensor  # (n, padded_len) int64, on the device


class TorchBackend:
    """A transformers model for ``embed`` or ``classify`` on one device.

    Args:
        model: an eval-mode ``PreTrainedModel`` already on ``device``.
        task: ``embed`` (``model`` returns ``last_hidden_state``) or ``classify`` (``logits``).
        max_length: maximum tokens per item (see :func:`consumer.model.tokenize.read_max_length`).
        pad_token_id: the tokenizer's padding id.
        device: a torch device string (``cpu``, ``cuda``, ``cuda:1``).
        pooling: for ``embed``.
        autocast: ``bf16``/``fp16`` autocast on CUDA, ``bf16`` on the CPU; None = fp32.

    Raises:
        ValueError: ``fp16`` on the CPU (no fast fp16 kernels there; use ``bf16``).
        name / revision: reported in replies.
        warmup_token_id: the token id :meth:`warmup` fills its batches with; it must be in
            the model's vocabulary (``load_runner`` takes it from the tokenizer, see
            :func:`warmup_token_id`). Default: the padding id.
        trace: run ``embed``/``classify`` on the CPU through a TorchScript trace of the model
            (:mod:`consumer.model.traced`: the same outputs, less per-op Python) for batches
            that run without autocast; eager when tracing fails (logged once) or elsewhere.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        task: Task,
        *,
        max_length: int,
        pad_token_id: int,
        device: str,
        pooling: Pooling | None = None,
        autocast: AutocastName | None = None,
        name: str = "model",
        revision: str | None = None,
        warmup_token_id: int | None = None,
        trace: bool = False,
    ) -> None:
        self.model = model
        self.warmup_token_id = pad_token_id if warmup_token_id is None else warmup_token_id
        self.task: Task = task
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.device = torch.device(device)
        self.pooling = pooling or Pooling()
        self.name = name
        self.revision = revision
        self.cuda = self.device.type == "cuda"
        self.prefetch = self.cuda
        self._staging = _PinnedStaging(self.device) if self.cuda else None
        self.autocast_dtype: torch.dtype | None = None
        if autocast == "fp16" and not self.cuda:
            raise ValueError("float16 autocast needs CUDA; on the CPU use bfloat16")
        if autocast is not None:
            self.autocast_dtype = torch.bfloat16 if autocast == "bf16" else torch.float16
        config = getattr(model, "config", None)
        id2label = getattr(config, "id2label", None) or {}
        self.labels: list[str] = [str(id2label[i]) for i in sorted(id2label)]
        if task == "classify" and not self.labels:
            raise ValueError("a classify model needs config.id2label")
        hidden = getattr(config, "hidden_size", None)
        self.embedding_dim: int | None = int(hidden) if task == "embed" and hidden else None
        self.normalizes = self.pooling.normalize
        self.traced: TracedNetwork | None = None
        if trace and task in ("embed", "classify") and not self.cuda:
            self.traced = trace_network(
                model, task, token_id=self.warmup_token_id, pad_id=pad_token_id
            )

    # -- ModelBackend --------------------------------------------------------------------

    def prepare(self, items: Sequence[TokenizedItem], padded_len: int) -> _Prepared:
        """Pad ``items`` to ``(n, padded_len)`` int64 ids and a 0/1 mask (pinned on CUDA) and
        copy them to the device without blocking. Raises ``ValueError`` for an item longer
        than ``padded_len``."""
        n = len(items)
        both = np.zeros((2, n, padded_len), dtype=np.int64)  # [0] ids, [1] mask
        ids, mask = both[0], both[1]
        if self.pad_token_id:
            ids.fill(self.pad_token_id)
        for i, t in enumerate(items):
            if t.n_tokens > padded_len:
                raise ValueError(f"item of {t.n_tokens} tokens > padded_len {padded_len}")
            ids[i, : t.n_tokens] = t.input_ids
            mask[i, : t.n_tokens] = 1
        on_device = self._to_device(both)
        return _Prepared(on_device[0], on_device[1])

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        """Compute a batch from :meth:`prepare`; one contract ``result`` map per row."""
        if not isinstance(prepared, _Prepared):
            raise TypeError("forward() takes the result of prepare()")
        autocast = self._autocast(prepared.ids.numel())
        eager = not isinstance(autocast, contextlib.nullcontext)
        with map_device_errors(), torch.inference_mode(), autocast:
            if self.task == "embed":
                hidden = self._network(prepared, eager=eager)
                pooled = self._pool(hidden, prepared.mask)
                emb = pooled
                if self.pooling.normalize:
                    emb = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
                rows: list[list[float]] = emb.cpu().tolist()
                raw = pooled.cpu().numpy()
                dim = emb.shape[-1]
                return [{"embedding": r, "dim": dim, "pooled": raw[i]} for i, r in enumerate(rows)]
            logits = self._network(prepared, eager=eager)
            probs = torch.softmax(logits.float(), dim=-1).cpu().tolist()
        labels = self.labels
        results: list[dict[str, Any]] = []
        for p in probs:
            best = max(range(len(p)), key=p.__getitem__)
            results.append(
                {
                    "label": labels[best],
                    "score": p[best],
                    "scores": dict(zip(labels, p, strict=True)),
                }
            )
        return results

    def warmup(self, batch_size: int, seq_len: int) -> None:
        """One forward of ``(batch_size, seq_len)`` real (unpadded) tokens; on CUDA it also
        synchronises so an out-of-memory error shows here. Every token is
        ``warmup_token_id`` (a real token of the model's own vocabulary: a fixed id such as
        1000 is out of range for a small vocabulary, e.g. ESM-2's 33 tokens)."""
        both = np.ones((2, batch_size, seq_len), dtype=np.int64)  # [0] ids, [1] mask
        both[0] = self.warmup_token_id
        with map_device_errors():
            on_device = self._to_device(both)
            self.forward(_Prepared(on_device[0], on_device[1]))
            if self.cuda:
                torch.cuda.synchronize(self.device)

    def is_oom(self, exc: BaseException) -> bool:
        """``torch.OutOfMemoryError``, ``MemoryError`` (:class:`DeviceOutOfMemoryError`
        included) or a message saying out of memory."""
        return isinstance(exc, torch.OutOfMemoryError) or is_out_of_memory(exc)

    def recover(self, exc: BaseException) -> None:
        """Release cached CUDA blocks after an out-of-memory error."""
        if self.cuda and self.is_oom(exc):
            torch.cuda.empty_cache()

    # -- internals -----------------------------------------------------------------------

    def _network(self, prepared: _Prepared, *, eager: bool) -> torch.Tensor:
        """``last_hidden_state`` (embed) or ``logits`` (classify) of a prepared batch: through
        the trace unless ``eager`` (autocast on) or there is none. A traced forward that fails
        other than by running out of memory turns the trace off (logged once) and the batch
        runs eager."""
        if self.traced is not None and not eager:
            try:
                return self.traced(prepared.ids, prepared.mask)
            except Exception as exc:
                if self.is_oom(exc):
                    raise
                log.warning(
                    "traced forward failed (%s: %s): the model runs eager from now on",
                    type(exc).__name__,
                    exc,
                )
                self.traced = None
        out = self.model(input_ids=prepared.ids, attention_mask=prepared.mask)
        return out.last_hidden_state if self.task == "embed" else out.logits  # type: ignore[no-any-return]

    def _to_device(self, a: np.ndarray[Any, Any]) -> torch.Tensor:
        if self._staging is None:
            return torch.from_numpy(a)
        return self._staging.to_device(a)

    def _autocast(self, padded_tokens: int) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        if not self.cuda and padded_tokens < CPU_BF16_MIN_PADDED_TOKENS:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(n, L, H)`` states and ``(n, L)`` mask → ``(n, H)`` float32 pooled embeddings,
        not normalised."""
        h = hidden.float()
        m = mask.unsqueeze(-1).to(h.dtype)
        mode = self.pooling.mode
        if mode == "cls":
            pooled = h[:, 0]
        elif mode == "max":
            pooled = h.masked_fill(m == 0, float("-inf")).max(dim=1).values
        else:
            summed = (h * m).sum(dim=1)
            counts = m.sum(dim=1).clamp(min=1.0)
            pooled = summed / (counts.sqrt() if mode == "mean_sqrt_len" else counts)
        return pooled


# Dense bf16/fp16 tensor-core peaks (TFLOP/s) of common accelerators, from vendor datasheets.
_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
    "T4": 65.0,
    "V100": 125.0,
}


def describe_runner(runner: ModelRunner) -> dict[str, Any]:
    """Facts for benchmark reports: device, its name, torch threads, the model's non-embedding
    parameters (≈ FLOPs/token / 2) and, on a known GPU, its dense bf16 peak in TFLOP/s."""
    backend = runner.backend
    info: dict[str, Any] = {"device": "unknown", "torch_threads": torch.get_num_threads()}
    if not isinstance(backend, TorchBackend):
        return info
    info["device"] = str(backend.device)
    params = sum(p.numel() for n, p in backend.model.named_parameters() if "embeddings" not in n)
    info["params_non_embedding"] = int(params)
    info["autocast"] = str(backend.autocast_dtype) if backend.autocast_dtype else None
    info["traced"] = backend.traced is not None
    if backend.cuda:
        name = torch.cuda.get_device_name(backend.device)
        info["device_name"] = name
        info["peak_tflops_bf16"] = next((v for k, v in _PEAK_TFLOPS.items() if k in name), None)
    return info
