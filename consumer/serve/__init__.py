"""``kbatch serve`` alone: the wiring, the intake loop and what only a long-running member needs.

:mod:`~consumer.serve.app` (wiring, signals), :mod:`~consumer.serve.pipeline` (intake),
:mod:`~consumer.serve.admission` (a request's verdict), :mod:`~consumer.serve.outbox` (replies
out), :mod:`~consumer.serve.rebalance` (partitions, commits, the drain),
:mod:`~consumer.serve.handover` (which revoked partitions continue),
:mod:`~consumer.serve.dedup` (one computation per key), :mod:`~consumer.serve.metrics` (every
metric, ``/healthz``), :mod:`~consumer.serve.replicas` (the ``--replicas N`` supervisor) and
:mod:`~consumer.serve.supervisor_watch` (a replica stops with its supervisor).
"""
