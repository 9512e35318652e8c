"""The jobs topic's records, their codec, and a job's status derived from them (pure).

Two kinds of record share the compacted jobs topic (docs/CONTRACT.md §Jobs topic):

* key ``JOB`` → :class:`JobRecord`: what to run (the backfill's own settings, the source
  ranges resolved once at submit) and the job's *declared* state.
* key ``JOB/MEMBER`` → :class:`MemberProgress`: one serve member's progress on the job.

One-writer rule (each key has one writer at a time, so compaction keeps the right value):

* ``JOB`` is written by ``kbatch backfill submit`` (``pending``), by ``kbatch backfill cancel``
  (``cancelled``), and by a serve member only to end the job: ``completed`` (written by the
  member that sees every partition's committed offset of the job's group at its end; ``failed``
  instead when every record failed, :func:`end_state`) or ``failed``. A terminal record is
  never rewritten by a member (:func:`is_terminal`); a cancel racing a completion keeps
  whichever came last (both are terminal).
* ``JOB/MEMBER`` is written only by that member.

``running`` is never written: :func:`derive_status` reports it for a ``pending`` job that has
member progress. A tombstone (value ``None``) deletes a key.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "JobCounts",
    "JobRecord",
    "JobState",
    "JobStatus",
    "JobTable",
    "MemberProgress",
    "MemberState",
    "RecordError",
    "decode_record",
    "derive_status",
    "encode_record",
    "end_state",
    "is_terminal",
    "new_job_id",
    "record_key",
    "sum_counts",
]

JobState = Literal["pending", "running", "completed", "failed", "cancelled"]
MemberState = Literal["running", "idle", "stopped", "failed"]
ShownMemberState = Literal["running", "idle", "stopped", "failed", "lost"]
LOST_AFTER_S = 30.0
"""A running or idle member silent this long is shown ``lost`` (it publishes every second; a
killed member's partitions move to the others after the job group's session timeout)."""
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
SCHEMA_VERSION = 1


class RecordError(ValueError):
    """A jobs-topic record that is not JSON of a known kind (skipped with a warning)."""


class JobCounts(BaseModel):
    """Records counted by the members (summed over them).

    ``done``: output records written with status ok; ``failed``: error replies and dead
    letters; ``skipped``: records an earlier run of the job's group had already finished
    (commit metadata, never scored twice). After a member was killed, the records it had scored
    but not committed are scored again by another member and counted twice (at-least-once).
    """

    model_config = ConfigDict(frozen=True)

    done: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)
    skipped: int = Field(default=0, ge=0)

    def __add__(self, other: JobCounts) -> JobCounts:
        return JobCounts(
            done=self.done + other.done,
            failed=self.failed + other.failed,
            skipped=self.skipped + other.skipped,
        )


class JobRecord(BaseModel):
    """Value of key ``job_id``: the job and its declared state.

    Attributes:
        job_id: ``[a-z0-9-]``, no ``/`` (keys of member records are ``job_id/member``).
        state: ``pending`` (submitted), ``completed``, ``failed`` or ``cancelled``.
        source_topic / output_topic: as ``kbatch backfill``'s flags.
        group_id: the job's own consumer group (members subscribe with it; it holds the
            committed offsets and the no-replay metadata).
        ranges: partition → ``[start, end)`` offsets, resolved once at submit (so every member
            agrees on the ends).
        settings: the backfill settings that define the output (text field, options, dead-letter
            topic, task…; never client or secret settings), as ``BackfillSettings`` fields.
        created_at_s / updated_at_s: Unix seconds.
        reason: why it failed or was cancelled.
        counts: the final counts (``completed``), summed from the member records.
    """

    kind: Literal["job"] = "job"
    version: int = SCHEMA_VERSION
    job_id: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    state: JobState = "pending"
    source_topic: str
    output_topic: str
    group_id: str
    ranges: dict[int, tuple[int, int]]
    settings: dict[str, Any] = Field(default_factory=dict)
    created_at_s: float
    updated_at_s: float
    reason: str | None = None
    counts: JobCounts | None = None

    @property
    def total_offsets(self) -> int:
        """Offsets in the job's ranges (an upper bound on records: compaction leaves gaps)."""
        return sum(max(0, end - start) for start, end in self.ranges.values())

    def with_state(
        self, state: JobState, now_s: float, *, reason: str | None = None,
        counts: JobCounts | None = None,
    ) -> JobRecord:  # fmt: skip
        """A copy in ``state`` at ``now_s``."""
        return self.model_copy(
            update={"state": state, "updated_at_s": now_s, "reason": reason, "counts": counts}
        )


class MemberProgress(BaseModel):
    """Value of key ``job_id/member``: one serve member's progress on a job.

    Attributes:
        member: the member's id (host-pid-random, stable for the process's life).
        state: ``running`` (reading partitions), ``idle`` (its partitions are at their end, or
            none assigned: waiting for the job to end or a rebalance), ``stopped`` (left the job:
            cancelled, completed or serve stopping), ``failed``.
        positions: partition → the offset below which this member finished every record
            (committed), for the partitions it held.
        counts: what this member counted since it started on the job.
        updated_at_s: Unix seconds.
    """

    kind: Literal["progress"] = "progress"
    version: int = SCHEMA_VERSION
    job_id: str
    member: str
    state: MemberState
    positions: dict[int, int] = Field(default_factory=dict)
    counts: JobCounts = Field(default_factory=JobCounts)
    updated_at_s: float
    reason: str | None = None


class JobStatus(BaseModel):
    """What ``kbatch backfill status`` shows for one job (:func:`derive_status`)."""

    job_id: str
    state: JobState
    source_topic: str
    output_topic: str
    group_id: str
    total_offsets: int
    finished_offsets: int
    counts: JobCounts
    members: dict[str, ShownMemberState]
    created_at_s: float
    updated_at_s: float
    reason: str | None = None

    @property
    def fraction(self) -> float:
        """Committed share of the range in [0, 1] (1 for an empty range): where a restart
        resumes. It trails :attr:`progress` by what is answered above the lowest unanswered
        offset of each partition (offsets commit contiguously)."""
        if self.total_offsets == 0:
            return 1.0
        return min(1.0, self.finished_offsets / self.total_offsets)

    @property
    def processed(self) -> int:
        """Records the members finished: ``done + failed + skipped``."""
        return self.counts.done + self.counts.failed + self.counts.skipped

    @property
    def progress(self) -> float:
        """What ``status`` headlines, in [0, 1]: records processed of the range's offsets
        (1 once completed: compaction gaps and transaction markers hold no record; a record
        counted twice after a member's crash cannot pass 1)."""
        if self.state == "completed" or self.total_offsets == 0:
            return 1.0
        return min(1.0, self.processed / self.total_offsets)


def new_job_id(now_s: float | None = None) -> str:
    """``job-YYYYmmdd-HHMMSS-xxxxxx``: sortable by submit time, random suffix (UTC)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now_s is None else now_s))
    return f"job-{stamp}-{secrets.token_hex(3)}"


def record_key(job_id: str, member: str | None = None) -> bytes:
    """The jobs-topic key of a job record (``member`` None) or of a member's progress."""
    return (job_id if member is None else f"{job_id}/{member}").encode()


def end_state(counts: JobCounts) -> tuple[JobState, str | None]:
    """The state a job whose every partition is committed at its end ends in, with its reason:
    ``failed`` when not one record was scored ok and some failed (``done == 0 < failed``: every
    record it read was an error reply or a dead letter, e.g. a ``--text-field`` no record
    has), else ``completed`` (failures among ok records show in the counts): a job whose every
    record failed is not ``completed``."""
    if counts.done == 0 and counts.failed > 0:
        return "failed", (
            f"every record failed ({counts.failed} error replies or dead letters, none ok)"
        )
    return "completed", None


def is_terminal(state: str) -> bool:
    """``completed``, ``failed`` and ``cancelled`` are final."""
    return state in TERMINAL


def encode_record(record: JobRecord | MemberProgress) -> bytes:
    """UTF-8 JSON of ``record``."""
    return record.model_dump_json().encode()


def decode_record(value: bytes) -> JobRecord | MemberProgress:
    """Parse one jobs-topic value.

    Raises:
        RecordError: not JSON, an unknown ``kind``, or a field out of its bounds.
    """
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError) as err:
        raise RecordError(f"not JSON: {err}") from None
    if not isinstance(data, dict):
        raise RecordError("not a JSON object")
    kind = data.get("kind")
    try:
        if kind == "job":
            return JobRecord.model_validate(data)
        if kind == "progress":
            return MemberProgress.model_validate(data)
    except ValidationError as err:
        raise RecordError(f"invalid {kind} record: {err}") from None
    raise RecordError(f"unknown kind {kind!r}")


def derive_status(
    job: JobRecord,
    progress: Iterable[MemberProgress],
    *,
    now_s: float | None = None,
    lost_after_s: float = LOST_AFTER_S,
) -> JobStatus:
    """The job's status from its record and its members' latest progress records.

    State: the record's terminal state if it has one (a ``completed`` one whose counts say
    that every record failed, :func:`end_state`, is shown ``failed``: written by a member before
    that rule, or with counts its table had not read yet); else ``running`` when a member
    reported progress, else ``pending``. Finished offsets: per partition the highest position
    any member reported (a member that took a partition over resumes from the committed
    offset, so the highest is the truth), less the range start; ``completed`` counts the whole
    range.
    Members: each one's last state; ``lost`` for a running or idle one silent for
    ``lost_after_s`` at ``now_s`` (Unix s; None: never lost). Counts: the members' sum (each
    member's last record: published before each of its commits, so complete once every
    partition is committed at its end); the record's final counts (what the member that ended
    the job had read then) only when no member record is left.
    """
    members = [p for p in progress if p.job_id == job.job_id]
    state: JobState = job.state
    if not is_terminal(state):
        state = "running" if members else "pending"
    reached: dict[int, int] = {}
    for p in members:
        for partition, position in p.positions.items():
            reached[partition] = max(reached.get(partition, 0), position)
    finished = 0
    for partition, (start, end) in job.ranges.items():
        if state == "completed":
            finished += max(0, end - start)
        else:
            finished += max(0, min(reached.get(partition, start), end) - start)
    counts = sum((p.counts for p in members), JobCounts()) if members else job.counts
    if counts is None:
        counts = JobCounts()
    reason = job.reason
    if state == "completed":
        state, reason = end_state(counts)
    return JobStatus(
        **job.model_dump(
            include={"job_id", "source_topic", "output_topic", "group_id", "created_at_s"}
        ),
        state=state,
        total_offsets=job.total_offsets,
        finished_offsets=finished,
        counts=counts,
        members={
            p.member: _shown(p, now_s, lost_after_s)
            for p in sorted(members, key=lambda m: m.member)
        },
        updated_at_s=max([job.updated_at_s, *(p.updated_at_s for p in members)]),
        reason=reason,
    )


def _shown(p: MemberProgress, now_s: float | None, lost_after_s: float) -> ShownMemberState:
    silent = now_s is not None and now_s - p.updated_at_s > lost_after_s
    return "lost" if silent and p.state in ("running", "idle") else p.state


class JobTable:
    """The latest value of every key of the jobs topic (what compaction keeps), in memory.

    :meth:`apply` one consumed record at a time; a tombstone deletes the key.
    """

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}
        self.progress: dict[tuple[str, str], MemberProgress] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> JobRecord | MemberProgress | None:
        """Apply one record; returns what it set (None for a tombstone).

        Raises:
            RecordError: the value does not decode, or the key does not match it.
        """
        if key is None:
            raise RecordError("a jobs-topic record without a key")
        name = key.decode(errors="replace")
        if value is None:
            self.jobs.pop(name, None)
            if "/" in name:
                job_id, member = name.split("/", 1)
                self.progress.pop((job_id, member), None)
            return None
        record = decode_record(value)
        expected = record_key(
            record.job_id, record.member if isinstance(record, MemberProgress) else None
        )
        if key != expected:
            raise RecordError(f"key {name!r} does not match its record ({expected.decode()!r})")
        if isinstance(record, JobRecord):
            self.jobs[record.job_id] = record
        else:
            self.progress[(record.job_id, record.member)] = record
        return record

    def members_of(self, job_id: str) -> list[MemberProgress]:
        """The latest progress record of each member of ``job_id``."""
        return [p for (j, _), p in self.progress.items() if j == job_id]

    def status(self, job_id: str, now_s: float | None = None) -> JobStatus:
        """:func:`derive_status` of ``job_id`` at ``now_s``. Raises KeyError: no such job."""
        return derive_status(self.jobs[job_id], self.members_of(job_id), now_s=now_s)

    def statuses(self, now_s: float | None = None) -> list[JobStatus]:
        """Every job's status at ``now_s``, oldest first."""
        jobs = sorted(self.jobs.values(), key=lambda j: (j.created_at_s, j.job_id))
        return [derive_status(j, self.members_of(j.job_id), now_s=now_s) for j in jobs]


def sum_counts(progress: Mapping[str, MemberProgress] | Iterable[MemberProgress]) -> JobCounts:
    """The members' counts summed."""
    values = progress.values() if isinstance(progress, Mapping) else progress
    return sum((p.counts for p in values), JobCounts())
