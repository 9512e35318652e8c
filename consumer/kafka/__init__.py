"""The Kafka layer: the only package of the service that imports a Kafka client (aiokafka,
confluent-kafka in ``confluent_adapter``).

Pure parts (offset tracking, flow control, ranges, the error tree) hold no I/O and import no
client; they are tested with tables. The adapters translate their client's objects at this
edge, and its errors into the layer's tree (``aiokafka_errors.map_kafka_errors``,
``confluent_adapter.errors.map_confluent_errors``); ``transport`` picks the adapter. The
adapters take the settings groups of ``config`` (client, consumer group, poll, sink), never a
command's settings.
"""
