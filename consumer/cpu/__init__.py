"""How many CPU cores kbatch may use, and how its thread pools share them.

- :mod:`consumer.cpu.budget` reads the budget: the smallest of the affinity set, the cgroup
  CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, rounded up) and
  ``--cpu-budget`` (``KBATCH_CPU_BUDGET``).
- :mod:`consumer.cpu.plan` turns a budget into thread-pool sizes (torch intra- and inter-op,
  ONNX Runtime, the tokenizer's Rayon pool, BLAS) with cores kept for the host path, and sets the
  environment the native pools read before they start.

Pure apart from reading ``/proc`` and ``/sys`` files and setting environment variables; torch is
configured by :func:`consumer.model.torch_backend.configure_threads` from the plan.
"""
