"""Backfill jobs run by ``kbatch serve`` (docs/JOBS.md).

A job is a backfill submitted as a record to a compacted jobs topic; every serve member reads
it and runs it through the job's own consumer group, feeding the bulk lane of its one loaded
engine. Pure parts: :mod:`consumer.jobs.records` (record codec, status derivation),
:mod:`consumer.jobs.job_engine` (a job's view of the engine); I/O: :mod:`consumer.jobs.runner`,
:mod:`consumer.jobs.worker`, :mod:`consumer.jobs.client`; Kafka access in
:mod:`consumer.kafka.jobs_topic` and :mod:`consumer.kafka.group_range`.
"""
