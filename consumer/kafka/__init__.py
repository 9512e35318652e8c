"""The Kafka layer: the only package of the service that imports aiokafka.

Pure parts (offset tracking, flow control, dedup) hold no I/O and are tested with tables;
source, sink and admin translate aiokafka's objects and errors at this edge.
"""
