"""The settings of ``kbatch backfill submit | status | cancel``, composed from the groups
(each defined once): ``kbatch backfill``'s, :class:`~consumer.kafka.config.KafkaClientSettings`
and :class:`~consumer.config.JobsSettings`."""

from __future__ import annotations

from consumer.backfill.config import BackfillSettings
from consumer.config import COMMAND_CONFIG, JobsSettings, SettingsBase
from consumer.kafka.config import KafkaClientSettings

__all__ = ["JobsClientSettings", "SubmitSettings"]


class JobsClientSettings(JobsSettings, KafkaClientSettings, SettingsBase):
    """``kbatch backfill status`` and ``cancel``: the brokers and the jobs topic."""

    model_config = COMMAND_CONFIG


class SubmitSettings(JobsSettings, BackfillSettings):
    """``kbatch backfill submit``: ``kbatch backfill``'s settings and the jobs topic."""

    model_config = COMMAND_CONFIG
