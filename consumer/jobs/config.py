"""The jobs settings group (docs/JOBS.md): where jobs are recorded and whether serve runs them.

Part of ``kbatch serve``'s settings (``--jobs-topic``, ``--jobs-topic-replication-factor``,
``--run-jobs/--no-run-jobs``); ``kbatch backfill submit`` takes the first two from here too
(it creates the topic when missing), ``status``/``cancel`` ``--jobs-topic``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

__all__ = ["DEFAULT_JOBS_TOPIC", "JobsSettings"]

DEFAULT_JOBS_TOPIC = "kbatch.jobs"


class JobsSettings(BaseModel):
    """Backfill jobs run by serve."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    jobs_topic: str = Field(
        DEFAULT_JOBS_TOPIC,
        min_length=1,
        description="Compacted topic of backfill jobs (kbatch backfill submit); created when "
        "missing.",
    )
    jobs_topic_replication_factor: PositiveInt | None = Field(
        None,
        description="Replicas of the jobs topic when it is created; default: the cluster's "
        "default.replication.factor, else min(3, brokers).",
    )
    run_jobs: bool = Field(
        True,
        description="Run the backfill jobs of --jobs-topic in this process's spare capacity "
        "(the engine's bulk lane).",
    )
