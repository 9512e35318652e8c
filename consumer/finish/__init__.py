"""What finishes a record, for serve and backfill alike: its reply sent, its offset committed.

:mod:`~consumer.finish.delivery` (replies to the sink, acks back to the offsets),
:mod:`~consumer.finish.checkpoint` (when and how offsets are committed, chosen once per delivery
mode) and :mod:`~consumer.finish.exactly_once` (the transactional commit of ``--exactly-once``).
"""
