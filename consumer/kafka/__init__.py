"""The Kafka layer: the only package of the service that imports aiokafka.

Pure parts (offset tracking, flow control) hold no I/O and are tested with tables; source,
sink, range source and admin translate aiokafka's objects at this edge, and its errors into the
layer's tree (``errors``: ``map_kafka_errors``). The adapters take the settings groups of
``config`` (client, consumer group, poll, sink), never a command's settings.
"""
