"""kbatch: a Kafka inference consumer.

The pipeline, one stage per layer::

    Kafka source (consumer.kafka) -> decode (schemas) -> dedup -> tokenize
      -> buckets / batch formation (consumer.batching, pure policy)
      -> padded batch on GPU or CPU (consumer.model, the only torch importer)
      -> keyed reply / dead letter (consumer.kafka sink) -> safe commit (consumer.kafka offsets)
"""

__version__ = "0.1.0"
