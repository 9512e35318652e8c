"""The jobs settings group (docs/JOBS.md): where jobs are recorded and whether serve runs them.

Part of ``kbatch serve``'s settings (``--jobs-topic``, ``--run-jobs/--no-run-jobs``); ``kbatch
backfill submit/status/cancel`` take ``--jobs-topic`` from here too.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

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
    run_jobs: bool = Field(
        True,
        description="Run the backfill jobs of --jobs-topic in this process's spare capacity "
        "(the engine's bulk lane).",
    )
