"""What a reply says, for serve, backfill and jobs alike: pure, no I/O.

:mod:`~consumer.replies.builder` (outcomes → reply and dead-letter records),
:mod:`~consumer.replies.task_options` (the 1.2 tasks' options), :mod:`~consumer.replies.chunking`
(chunked embeddings) and :mod:`~consumer.replies.topic_policy` (which reply topics a request may
name). The embed options and entity grouping they use sit in the root (:mod:`consumer.options`,
:mod:`consumer.entities`): the model and batching layers read them too.
"""
