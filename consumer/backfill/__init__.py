"""``kbatch backfill``: re-score a topic's history over an offset or time range.

::

    RangeSource.poll ──► extract text (dotted path / raw UTF-8) ──► Engine.submit (waits off)
         │                      │ bad record                          │ ItemOutcome
         │                      ▼                                     ▼
         │              dead letter (build_dead_letter)       reply value (CONTRACT.md)
         │                      └──────────────► KafkaSink ◄──────────┘
         ▼                                          │ broker ack
    commit (own group) ◄── OffsetTracker.complete ◄─┘

Modules: :mod:`~consumer.backfill.config` (settings), :mod:`~consumer.backfill.extract` (pure
text extraction and output records), :mod:`~consumer.backfill.job` (the loop),
:mod:`~consumer.backfill.progress` (rich bar and summary), :mod:`~consumer.backfill.app`
(wiring, signals).
"""
