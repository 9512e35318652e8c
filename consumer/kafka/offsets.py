"""Which offset is safe to commit, per partition, when records finish out of order.

Pure: no aiokafka, no I/O, no clock. The consumer calls :meth:`OffsetTracker.track` as it
takes a record in, :meth:`OffsetTracker.complete` when the record's reply (or dead letter)
has been acknowledged by the broker, and commits what :meth:`OffsetTracker.committable`
returns.

Rules (CONTRACT.md §Delivery, Kafka commit semantics):

* The committed offset of a partition is the offset of the NEXT record to read, so
  committing ``n`` declares every record below ``n`` done.
* Batching by token length reorders work inside a partition, so the committable offset is the
  lowest tracked offset that has not finished, or the last finished offset + 1 when none is
  left. A commit never skips an unfinished record: a crash repeats replies, never loses one.
* Offsets need not be contiguous (compacted topics, transaction markers): only tracked
  offsets matter. Offsets are tracked in increasing order per partition, as Kafka delivers
  them, so an offset in a gap below a tracked one will never be tracked later.
* Offsets finished above the committed one are written into the commit's metadata
  (:mod:`consumer.kafka.offset_metadata`): :meth:`OffsetTracker.commit_metadata`. A partition
  whose finished set grew is committable even when its offset did not move, and when nothing
  below its oldest unfinished record was taken, that record's offset is committed with them.
  Read back at assignment, they are given to :meth:`OffsetTracker.add_completed`; such a record
  is then taken already finished (:meth:`OffsetTracker.skip_completed`), never recomputed.
* Each assignment of a partition is a *generation*. A completion carrying an older generation
  (the partition was revoked and assigned again while its batch ran) is ignored: the new owner
  of that generation re-reads from the last commit.
* Between a revoke and the next assignment (aiokafka's eager rebalance revokes everything
  first) a partition is *suspended*: it is neither assigned nor committable, but completions
  of its generation still apply, so that an assignment giving it back to this member
  (:meth:`OffsetTracker.resume`) carries on where it was.

Cost: ``track`` O(1); ``complete`` amortized O(1) (each offset leaves the queue once);
``committable`` O(partitions with progress).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from consumer.kafka.offset_metadata import MAX_METADATA_BYTES, Encoded, encode_completed
from consumer.kafka.records import TopicPartition


class _Partition:
    """State of one assignment of one partition."""

    __slots__ = (
        "committed",
        "committed_version",
        "completed_earlier",
        "generation",
        "last_done",
        "last_tracked",
        "offered_version",
        "queue",
        "unfinished",
        "version",
    )

    def __init__(self, generation: int) -> None:
        self.generation = generation
        # Tracked offsets in increasing order, from the lowest unfinished one onward; finished
        # offsets stay in it until every lower offset has finished too.
        self.queue: deque[int] = deque()
        self.unfinished: set[int] = set()
        self.last_tracked: int | None = None
        # Highest offset whose every lower tracked offset has finished (None: none yet).
        self.last_done: int | None = None
        # Last offset committed by this assignment (None: none yet).
        self.committed: int | None = None
        # Offsets finished by an earlier owner (commit metadata), not taken in yet.
        self.completed_earlier: set[int] = set()
        # Bumped by every completion; the version offered by committable() and committed.
        self.version = self.offered_version = self.committed_version = 0

    def next_offset(self) -> int | None:
        """The offset to commit now, or None when nothing has finished in this assignment.

        When the oldest tracked record is unfinished but a later one (or an offset finished
        earlier) is done, it is the oldest tracked offset: the commit then carries the done
        set in its metadata.
        """
        if self.last_done is None:
            if self.queue and (len(self.queue) > len(self.unfinished) or self.completed_earlier):
                return self.queue[0]
            return None
        return self.queue[0] if self.queue else self.last_done + 1

    def done_above(self, offset: int) -> list[int]:
        """Finished offsets above ``offset``: tracked ones and ones finished earlier."""
        done = [o for o in self.queue if o > offset and o not in self.unfinished]
        done.extend(o for o in self.completed_earlier if o > offset)
        return done


class OffsetTracker:
    """Per-partition commit positions for records that finish out of order.

    Partitions must be :meth:`assign`-ed before records of them are tracked. See the module
    docstring for the rules and where they come from.
    """

    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._suspended: dict[TopicPartition, _Partition] = {}
        self._next_generation = 1

    def assign(self, tp: TopicPartition) -> int:
        """Start a new assignment of ``tp`` and return its generation.

        Generations are unique across all partitions and never reused, so a completion from
        any earlier assignment is recognised as stale. State of a previous assignment, if any,
        is discarded.
        """
        generation = self._next_generation
        self._next_generation += 1
        self._partitions[tp] = _Partition(generation)
        self._suspended.pop(tp, None)
        return generation

    def revoke(self, tp: TopicPartition) -> None:
        """Forget ``tp`` (assigned or suspended): later completions for it are ignored.
        Unknown partitions are a no-op.

        Commit what :meth:`committable` returns *before* revoking, if the commit is wanted.
        """
        self._partitions.pop(tp, None)
        self._suspended.pop(tp, None)

    def suspend(self, tp: TopicPartition) -> None:
        """Take ``tp`` out of :attr:`assigned` and :meth:`committable` but keep its state:
        completions of its generation still apply (a no-op when ``tp`` is not assigned)."""
        state = self._partitions.pop(tp, None)
        if state is not None:
            self._suspended[tp] = state

    def resume(self, tp: TopicPartition) -> bool:
        """Assign a suspended ``tp`` again with its state and generation; False when it was
        not suspended (then nothing changes)."""
        state = self._suspended.pop(tp, None)
        if state is None:
            return False
        self._partitions[tp] = state
        return True

    @property
    def suspended(self) -> frozenset[TopicPartition]:
        """The partitions suspended (revoked, their next assignment not known yet)."""
        return frozenset(self._suspended)

    def last_tracked(self, tp: TopicPartition) -> int | None:
        """The highest offset tracked of ``tp`` (assigned or suspended); None when none."""
        state = self._partitions.get(tp) or self._suspended.get(tp)
        return None if state is None else state.last_tracked

    def generation(self, tp: TopicPartition) -> int | None:
        """The current generation of ``tp``, or None when it is not assigned."""
        state = self._partitions.get(tp)
        return None if state is None else state.generation

    def committed(self, tp: TopicPartition) -> int | None:
        """The highest offset :meth:`mark_committed` recorded for ``tp`` in this assignment;
        None when none yet or ``tp`` is not assigned."""
        state = self._partitions.get(tp)
        return None if state is None else state.committed

    @property
    def assigned(self) -> frozenset[TopicPartition]:
        """The partitions currently assigned."""
        return frozenset(self._partitions)

    def track(self, tp: TopicPartition, offset: int) -> int:
        """Record that the record at ``offset`` of ``tp`` was taken in; returns the generation.

        The caller keeps the generation with the record and passes it to :meth:`complete`.

        Raises:
            KeyError: ``tp`` is not assigned.
            ValueError: ``offset`` is negative or not above the last tracked offset of ``tp``.
        """
        state = self._partitions.get(tp)
        if state is None:
            raise KeyError(f"partition {tp} is not assigned")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset} for {tp}")
        if state.last_tracked is not None and offset <= state.last_tracked:
            raise ValueError(
                f"offsets of {tp} must be tracked in increasing order: "
                f"got {offset} after {state.last_tracked}"
            )
        state.last_tracked = offset
        state.queue.append(offset)
        state.unfinished.add(offset)
        return state.generation

    def add_completed(self, tp: TopicPartition, offsets: Iterable[int]) -> int:
        """Offsets of ``tp`` finished by an earlier owner (read back from commit metadata).

        Each is taken already finished when it arrives (:meth:`skip_completed`) and is
        written into this assignment's commit metadata until the committed offset passes it.
        Offsets at or below the last tracked one are left out (they were taken in already
        and are computed). Returns how many were added; 0 when ``tp`` is not assigned.
        """
        state = self._partitions.get(tp)
        if state is None:
            return 0
        floor = -1 if state.last_tracked is None else state.last_tracked
        added = {o for o in offsets if o > floor} - state.completed_earlier
        state.completed_earlier |= added
        return len(added)

    def skip_completed(self, tp: TopicPartition, offset: int) -> bool:
        """Take ``offset`` in already finished when an earlier owner finished it.

        Returns True when it did (the caller neither computes nor answers the record); False
        when ``offset`` is not one of :meth:`add_completed`'s or ``tp`` is not assigned.

        Raises:
            ValueError: as :meth:`track`.
        """
        state = self._partitions.get(tp)
        if state is None or offset not in state.completed_earlier:
            return False
        generation = self.track(tp, offset)
        state.completed_earlier.discard(offset)
        self.complete(tp, offset, generation)
        return True

    def complete(self, tp: TopicPartition, offset: int, generation: int) -> bool:
        """Mark ``offset`` of ``tp`` finished (its reply or dead letter was acknowledged).

        Returns True when applied; False when ignored because ``tp`` is not assigned,
        ``generation`` is not the current one, or ``offset`` is not an unfinished tracked
        offset (never tracked, or completed already). Never raises.
        """
        state = self._partitions.get(tp) or self._suspended.get(tp)
        if state is None or state.generation != generation or offset not in state.unfinished:
            return False
        state.unfinished.remove(offset)
        state.version += 1
        queue = state.queue
        while queue and queue[0] not in state.unfinished:
            state.last_done = queue.popleft()
        return True

    def pending(self, tp: TopicPartition) -> int:
        """Tracked records of ``tp`` not finished yet (0 when ``tp`` is neither assigned nor
        suspended)."""
        state = self._partitions.get(tp) or self._suspended.get(tp)
        return 0 if state is None else len(state.unfinished)

    def committable(self) -> dict[TopicPartition, int]:
        """Offsets to commit now: per partition whose position moved, or whose finished set
        grew, since its last commit.

        Each value is the next offset to read (Kafka semantics): the lowest unfinished tracked
        offset, or the last finished offset + 1 when all tracked records have finished. The
        finished set offered here is the one :meth:`mark_committed` records as committed.
        """
        result: dict[TopicPartition, int] = {}
        for tp, state in self._partitions.items():
            offset = state.next_offset()
            if offset is None:
                continue
            moved = state.committed is None or offset > state.committed
            if moved or state.version != state.committed_version:
                result[tp] = offset
                state.offered_version = state.version
        return result

    def commit_metadata(
        self, offsets: Mapping[TopicPartition, int], max_bytes: int = MAX_METADATA_BYTES
    ) -> dict[TopicPartition, Encoded]:
        """The commit metadata of each of ``offsets`` (from :meth:`committable`): the finished
        offsets above it, encoded (:func:`consumer.kafka.offset_metadata.encode_completed`,
        at most ``max_bytes`` characters). Partitions not assigned get ``""``."""
        out: dict[TopicPartition, Encoded] = {}
        for tp, offset in offsets.items():
            state = self._partitions.get(tp)
            done = state.done_above(offset) if state is not None else []
            out[tp] = encode_completed(offset, done, max_bytes)
        return out

    def mark_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Record that ``offsets`` were committed (the broker acknowledged the commit).

        Partitions not assigned are ignored; a lower offset than one already recorded does
        not move the position back. Finished offsets below the committed one that were never
        taken in (compaction gaps) are forgotten.
        """
        for tp, offset in offsets.items():
            state = self._partitions.get(tp)
            if state is None:
                continue
            state.committed_version = state.offered_version
            if state.committed is None or offset > state.committed:
                state.committed = offset
            state.completed_earlier = {o for o in state.completed_earlier if o >= offset}
