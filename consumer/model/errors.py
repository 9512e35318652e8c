"""The errors of the model layer (``consumer.model``): one tree, a ``retriable`` flag each.

::

    ModelError                      base of what consumer.model raises
     ├── ModelNotFoundError         --model names no model directory (also a FileNotFoundError);
     │    │                         not retriable
     │    └── ModelLibrariesMissingError  torch/transformers not installed (no [serve] extra)
     ├── LossyBackendError          the backend/precision failed the start-up quality gate
     │                              (consumer.model.quality); not retriable: --allow-lossy
     └── DeviceOutOfMemoryError     the device cannot hold a batch of this shape (also a
          │                         MemoryError); retriable with a smaller batch: the runner
          │                         splits it, the engine's warm-up lowers the token budget
          └── FakeOOMError          the fake backend's (tests, ``--model noop``)

``retriable`` means "the same work may succeed in a smaller or later attempt", as in
``schemas.errors`` and ``consumer.kafka.errors``.

torch's out-of-memory errors (``torch.OutOfMemoryError``, a ``RuntimeError`` whose message
says "CUDA out of memory", or a host ``MemoryError``) are translated at the layer edge by
:func:`map_device_errors`, chained with ``from``. Any other exception of a forward pass is
left as it is: the runner answers it as ``inference_failed`` naming its type (CONTRACT.md
§Reply record), so its type is part of the reply's bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

__all__ = [
    "DeviceOutOfMemoryError",
    "FakeOOMError",
    "LossyBackendError",
    "ModelError",
    "ModelLibrariesMissingError",
    "ModelNotFoundError",
    "map_device_errors",
    "require_model_libraries",
]


class ModelError(Exception):
    """Base of every error the model layer raises."""

    retriable: ClassVar[bool] = False


class ModelNotFoundError(ModelError, FileNotFoundError):
    """``--model`` is neither a known alias nor a ``save_pretrained`` directory."""


class ModelLibrariesMissingError(ModelNotFoundError):
    """No model can be loaded here: torch or transformers is not installed (a client install,
    ``pip install kbatch``, without the ``[serve]`` extra)."""


class LossyBackendError(ModelError):
    """A backend or precision answers too far from torch fp32 on the start-up probe texts
    (:func:`consumer.model.quality.check_gate`); ``--allow-lossy`` serves it anyway."""


class DeviceOutOfMemoryError(ModelError, MemoryError):
    """The device ran out of memory for one batch or warm-up shape."""

    retriable: ClassVar[bool] = True


class FakeOOMError(DeviceOutOfMemoryError):
    """The fake backend's out-of-memory error."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` means "out of memory": a ``MemoryError`` or a message saying so
    (``torch.OutOfMemoryError`` is a ``RuntimeError`` whose message says "CUDA out of memory")."""
    return isinstance(exc, MemoryError) or "out of memory" in str(exc)


@contextlib.contextmanager
def map_device_errors() -> Iterator[None]:
    """Translate an out-of-memory error raised inside into :class:`DeviceOutOfMemoryError`
    (``from`` the original); everything else passes unchanged.

    Raises:
        DeviceOutOfMemoryError: the block ran out of device (or host) memory.
    """
    try:
        yield
    except DeviceOutOfMemoryError:
        raise
    except Exception as exc:
        if is_out_of_memory(exc):
            raise DeviceOutOfMemoryError(str(exc)) from exc
        raise


SERVE_EXTRA_HINT = (
    "pip install 'kbatch[serve]' (on a CPU-only host first: pip install torch "
    "--index-url https://download.pytorch.org/whl/cpu, which skips the CUDA wheels)"
)
"""What to run where the model libraries are missing."""


def require_model_libraries() -> None:
    """Raise unless torch and transformers can be imported (checked without importing them).

    Raises:
        ModelLibrariesMissingError: one or both are missing; the message says what to install.
    """
    import importlib.util

    missing = []
    for name in ("torch", "transformers"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise ModelLibrariesMissingError(
            f"serving a model needs {' and '.join(missing)}, not installed here (a client "
            f"install: kbatch request, load, topics and broker need neither): {SERVE_EXTRA_HINT}"
        )
