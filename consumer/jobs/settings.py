"""The settings of ``kbatch backfill submit | status | cancel``, composed from the groups
(each defined once): ``kbatch backfill``'s, :class:`~consumer.kafka.config.KafkaClientSettings`
and :class:`~consumer.config.JobsSettings`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from consumer.backfill.config import BackfillSettings
from consumer.config import (
    BACKFILL_CONFIG,
    COMMAND_CONFIG,
    CONNECTION_FIELDS,
    JobsSettings,
    SettingsBase,
)
from consumer.kafka.config import KafkaClientSettings

__all__ = ["JobsClientSettings", "SubmitSettings"]


class JobsClientSettings(JobsSettings, KafkaClientSettings, SettingsBase):
    """``kbatch backfill status`` and ``cancel``: the brokers and the jobs topic."""

    model_config = COMMAND_CONFIG
    help_overrides: ClassVar[Mapping[str, str]] = {
        "jobs_topic": "Compacted topic of backfill jobs (the one kbatch backfill submit wrote "
        "the job to).",
    }


class SubmitSettings(JobsSettings, BackfillSettings):
    """``kbatch backfill submit``: ``kbatch backfill``'s settings (``KBATCH_BACKFILL_*``) and the
    jobs topic; the connection and the jobs topic are also read from serve's ``KBATCH_*`` (the
    job is for the serve members watching that topic)."""

    model_config = BACKFILL_CONFIG
    shared_env_fields: ClassVar[frozenset[str]] = CONNECTION_FIELDS | {
        "jobs_topic",
        "jobs_topic_replication_factor",
    }
    help_overrides: ClassVar[Mapping[str, str]] = {
        **BackfillSettings.help_overrides,
        "group_id": "Consumer group the serve members run the job under; default: "
        "kbatch-job.<job-id> (each job its own).",
        "model": "Run the job only on serve members serving this model (each runs it with "
        "the model it has loaded); default: any member serving the job's --task.",
        "jobs_topic": "Compacted topic of backfill jobs the serve members watch; created when "
        "missing.",
    }
