"""One computation per request key (CONTRACT.md §Delivery, "One computation per key").

Pure: no I/O, no clock of its own (``now`` is passed in, monotonic seconds), no dependency on
other project modules. Generic over the waiter type ``W`` (whatever the consumer needs to
answer a copy: its reply address, correlation id, meta, offset) and the result type ``R``.

Two maps, both keyed by the request key (bytes):

* in flight: key -> the first record's item id, the partition it came from and the copies
  waiting for its result;
* completed: key -> the stored result, its partition and when it was stored; bounded by
  ``ttl_s`` (default 300 s) and ``max_entries`` (default 100,000), the contract's dedup window.
  Eviction is in insertion order: the oldest answer leaves first, and a hit does not extend
  its life (the window counts from the answer).

Each entry keeps the digest of its first copy's input (:func:`input_digest`: 16 bytes of
BLAKE2b over the text, and for rerank the documents too; never the text itself). A copy whose
digest differs is another request under a reused key (contract 1.4): :meth:`DedupCache.begin`
answers REUSED, and the caller answers it ``idempotency_key_reused`` instead of the first
input's result; the entry is left as it is, so true copies still share it.

Errors are not cached: :meth:`DedupCache.fail` answers the waiters with the error (the caller
does it) but stores nothing, so a client retry after e.g. ``inference_failed`` gets a new
computation instead of the same failure for five minutes.

A key's entries belong to the partition of its first record (with the default partitioner
every copy of a key is on that partition); :meth:`DedupCache.drop_partition` drops them at
revoke, since the partition's new owner re-reads its uncommitted records.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from consumer.kafka.records import TopicPartition

W = TypeVar("W")
R = TypeVar("R")


class DedupKind(enum.Enum):
    """What :meth:`DedupCache.begin` decided for a record."""

    FIRST = "first"
    """No copy in flight or answered: compute it, then :meth:`DedupCache.finish` or ``fail``."""
    IN_FLIGHT = "in_flight"
    """A copy is being computed: :meth:`DedupCache.attach_waiter`; answered at finish/fail."""
    DONE = "done"
    """A copy was answered within the window: answer from ``Decision.result``."""
    REUSED = "reused"
    """The key is in flight or answered for another input: answer ``idempotency_key_reused``;
    nothing is registered."""


INPUT_DIGEST_BYTES = 16
"""Length of :func:`input_digest` (BLAKE2b-128: a chance collision between two inputs of one
key is ~2⁻¹²⁸)."""


def input_digest(text: str, documents: Sequence[str] | None = None) -> bytes:
    """The digest of a request's input, ``INPUT_DIGEST_BYTES`` bytes (contract 1.4).

    ``text`` is the request's text as sent (rerank: the query; with chunking: the whole
    document), before any prompt; ``documents`` the rerank documents (None on other tasks).
    Each part is hashed as its UTF-8 length (8 bytes, big-endian) and bytes, and documents are
    preceded by their count, so no two different inputs are one byte string (``["ab"]`` is not
    ``["a", "b"]``, no documents is not an empty text). Options are not part of it: copies with
    other options are shaped or computed for their own (contract 1.1).
    """
    digest = hashlib.blake2b(digest_size=INPUT_DIGEST_BYTES)
    _add(digest, text)
    if documents is not None:
        digest.update(b"\x01" + len(documents).to_bytes(8, "big"))
        for document in documents:
            _add(digest, document)
    return digest.digest()


def _add(digest: hashlib.blake2b, part: str) -> None:
    data = part.encode("utf-8", "surrogatepass")
    digest.update(len(data).to_bytes(8, "big"))
    digest.update(data)


# One Decision per request and one _InFlight/_Done per computation: slotted, not frozen (a
# frozen __init__ costs ~3× a plain one); read-only all the same.


@dataclass(slots=True)
class Decision(Generic[R]):
    """The outcome of :meth:`DedupCache.begin`.

    ``item_id`` is the computing record's item id (FIRST: the one passed in; IN_FLIGHT: the
    first copy's); None for DONE and REUSED. ``result`` is set only for DONE.
    """

    kind: DedupKind
    item_id: int | None = None
    result: R | None = None


@dataclass(slots=True)
class _InFlight(Generic[W]):
    item_id: int
    tp: TopicPartition
    digest: bytes
    waiters: list[W] = field(default_factory=list)


@dataclass(slots=True)
class _Done(Generic[R]):
    result: R
    tp: TopicPartition
    stored_s: float
    digest: bytes


class DedupCache(Generic[W, R]):
    """In-flight and completed maps by request key. See the module docstring.

    Raises:
        ValueError: ``ttl_s`` is not positive or ``max_entries`` is below 1.
    """

    def __init__(self, ttl_s: float = 300.0, max_entries: int = 100_000) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._in_flight: dict[bytes, _InFlight[W]] = {}
        self._done: OrderedDict[bytes, _Done[R]] = OrderedDict()
        # At most the oldest completed entry's ``stored_s`` (+inf when none): begin() looks
        # for expired entries only once this is ``ttl_s`` old, not on every record.
        self._oldest_s = math.inf

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def completed_count(self) -> int:
        return len(self._done)

    def begin(
        self, key: bytes, tp: TopicPartition, now: float, item_id: int, digest: bytes = b""
    ) -> Decision[R]:
        """Decide for a record with ``key`` from ``tp``, item ``item_id``, at ``now`` (s),
        whose input has ``digest`` (:func:`input_digest`; ``b""`` for every copy: the input
        is not compared).

        FIRST registers the key as in flight with this item as its computation. Expired
        completed entries are dropped first, so a key answered more than ``ttl_s`` ago is
        computed again, whatever its input. REUSED: the key's entry has another digest.
        """
        if now - self._oldest_s >= self._ttl_s:
            self.expire(now)
        flight = self._in_flight.get(key)
        if flight is not None:
            if flight.digest != digest:
                return Decision(DedupKind.REUSED)
            return Decision(DedupKind.IN_FLIGHT, item_id=flight.item_id)
        done = self._done.get(key)
        if done is not None:
            if done.digest != digest:
                return Decision(DedupKind.REUSED)
            return Decision(DedupKind.DONE, result=done.result)
        self._in_flight[key] = _InFlight(item_id, tp, digest)
        return Decision(DedupKind.FIRST, item_id=item_id)

    def attach_waiter(self, key: bytes, waiter: W) -> None:
        """Add ``waiter`` to the copies waiting for the in-flight ``key``.

        Raises:
            KeyError: ``key`` is not in flight (begin did not answer IN_FLIGHT for it).
        """
        flight = self._in_flight.get(key)
        if flight is None:
            raise KeyError(f"key {key!r} is not in flight")
        flight.waiters.append(waiter)

    def finish(self, key: bytes, result: R, now: float, item_id: int | None = None) -> list[W]:
        """Store ``result`` for ``key`` at ``now`` (s) and return the waiters to answer.

        Returns [] and stores nothing when ``key`` is not in flight (dropped at revoke) or,
        if ``item_id`` is given, when another item is computing it now (a stale finish).
        The oldest completed entries are evicted beyond ``max_entries``.
        """
        flight = self._take(key, item_id)
        if flight is None:
            return []
        self._done[key] = _Done(result, flight.tp, now, flight.digest)
        self._done.move_to_end(key)
        self._oldest_s = min(self._oldest_s, now)
        while len(self._done) > self._max_entries:
            self._done.popitem(last=False)
        return flight.waiters

    def fail(self, key: bytes, item_id: int | None = None) -> list[W]:
        """End the computation of ``key`` without storing a result; return its waiters.

        The caller answers them with the error. Same rules as :meth:`finish` for unknown
        keys and ``item_id``.
        """
        flight = self._take(key, item_id)
        return [] if flight is None else flight.waiters

    def drop_partition(self, tp: TopicPartition) -> list[W]:
        """Drop every entry of ``tp`` (on revoke); return the waiters of dropped in-flight keys.

        The owner decides what to do with them (usually nothing: their records are
        uncommitted and will be re-read by the partition's new owner). O(entries).
        """
        waiters: list[W] = []
        for key in [k for k, f in self._in_flight.items() if f.tp == tp]:
            waiters.extend(self._in_flight.pop(key).waiters)
        for key in [k for k, d in self._done.items() if d.tp == tp]:
            del self._done[key]
        return waiters

    def expire(self, now: float) -> int:
        """Drop completed entries stored ``ttl_s`` or more before ``now``; return how many.

        Amortized O(1): entries are in storing order, so it stops at the first live one.
        """
        dropped = 0
        self._oldest_s = math.inf
        while self._done:
            key, done = next(iter(self._done.items()))
            if now - done.stored_s < self._ttl_s:
                self._oldest_s = done.stored_s
                break
            del self._done[key]
            dropped += 1
        return dropped

    def _take(self, key: bytes, item_id: int | None) -> _InFlight[W] | None:
        flight = self._in_flight.get(key)
        if flight is None or (item_id is not None and flight.item_id != item_id):
            return None
        return self._in_flight.pop(key)
