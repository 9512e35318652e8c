"""The producer's partitioner for records without a partition: aiokafka's (Java's) rule, cheaper.

A reply without ``kafka_replyPartition`` goes to the partition its key hashes to, as the Java
client's default partitioner does: ``murmur2(key) & 0x7fffffff`` modulo the partition count
(a null key picks a random available partition). aiokafka's ``DefaultPartitioner`` computes
this in pure Python at ~16 µs for a 40-byte key; :func:`murmur2` here reads the key in 32-bit
words (~7 µs) and a topic with one partition skips the hash (any hash modulo 1 is 0). Same
partitions, held by a property test against aiokafka's own ``murmur2``.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from typing import Final

__all__ = ["murmur2", "partition_by_key"]

_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` (``org.apache.kafka.common.utils.Utils.murmur2``), as
    an unsigned 32-bit int (aiokafka's convention)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    words = length >> 2
    for k in struct.unpack_from(f"<{words}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) ^ (k * _M)) & _MASK
    tail = length & ~3
    extra = length & 3
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h = ((h ^ data[tail]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def partition_by_key(
    key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
) -> int:
    """aiokafka's ``partitioner`` signature: the partition of ``key`` among ``all_partitions``
    (sorted by id), or a random one of ``available`` (else of all) for a null key."""
    if key is None:
        return random.choice(available or all_partitions)
    if len(all_partitions) == 1:
        return all_partitions[0]
    return all_partitions[(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)]
