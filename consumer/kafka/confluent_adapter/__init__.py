"""The confluent-kafka (librdkafka) adapter of the transport seam (:mod:`consumer.kafka.transport`).

Only modules in this folder import ``confluent_kafka``. librdkafka runs its own threads; the
adapters hand what they get back to the asyncio loop of their owner.
"""
