"""The jobs topic's records: codec, the one-writer table, and status derivation (pure)."""

from __future__ import annotations

import pytest

from consumer.jobs.records import (
    JobCounts,
    JobRecord,
    JobTable,
    MemberProgress,
    RecordError,
    decode_record,
    derive_status,
    encode_record,
    end_state,
    is_terminal,
    new_job_id,
    record_key,
)
from tests.fakes import FakeClock

RANGES = {0: (0, 100), 1: (10, 60), 2: (5, 5)}  # 150 offsets; partition 2 empty


def _job(clock: FakeClock, **kw: object) -> JobRecord:
    base: dict[str, object] = dict(
        job_id="job-1",
        source_topic="src",
        output_topic="out",
        group_id="kbatch-job.job-1",
        ranges=RANGES,
        settings={"task": "embed"},
        created_at_s=clock(),
        updated_at_s=clock(),
    )
    return JobRecord.model_validate({**base, **kw})


def _progress(clock: FakeClock, member: str, positions: dict[int, int], done: int,
              state: str = "running", **kw: int) -> MemberProgress:  # fmt: skip
    return MemberProgress.model_validate(
        dict(
            job_id="job-1",
            member=member,
            state=state,
            positions=positions,
            counts=JobCounts(done=done, **kw),
            updated_at_s=clock(),
        )
    )


def test_records_round_trip_through_json_with_integer_partitions() -> None:
    clock = FakeClock()
    job = _job(clock)
    back = decode_record(encode_record(job))
    assert back == job and isinstance(back, JobRecord)
    assert back.ranges[1] == (10, 60)
    progress = _progress(clock, "m1", {0: 40}, 40)
    assert decode_record(encode_record(progress)) == progress


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"kind": "other"}', "unknown kind"),
        (b'{"kind": "job", "job_id": "a/b"}', "invalid job record"),
    ],
)
def test_a_bad_record_is_a_record_error(value: bytes, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        decode_record(value)


def test_keys_and_ids() -> None:
    assert record_key("job-1") == b"job-1"
    assert record_key("job-1", "host-1-ab") == b"job-1/host-1-ab"
    jid = new_job_id(0.0)
    assert jid.startswith("job-19700101-000000-") and "/" not in jid
    assert new_job_id(0.0) != jid
    assert [is_terminal(s) for s in ("pending", "running", "completed", "failed", "cancelled")] == [
        False, False, True, True, True,
    ]  # fmt: skip


def test_pending_becomes_running_with_member_progress_and_sums_counts() -> None:
    clock = FakeClock()
    job = _job(clock)
    assert derive_status(job, []).state == "pending"
    clock.now_s += 5
    a = _progress(clock, "a", {0: 40}, 38, failed=2)
    b = _progress(clock, "b", {1: 30}, 20, skipped=1)
    status = derive_status(job, [a, b])
    assert status.state == "running"
    assert (status.counts.done, status.counts.failed, status.counts.skipped) == (58, 2, 1)
    assert (status.finished_offsets, status.total_offsets) == (40 + 20, 150)
    assert status.fraction == pytest.approx(60 / 150)
    assert status.members == {"a": "running", "b": "running"}
    assert status.updated_at_s == 105.0


def test_a_taken_over_partition_counts_the_highest_position() -> None:
    clock = FakeClock()
    job = _job(clock)
    killed = _progress(clock, "a", {0: 40, 1: 20}, 50)
    taker = _progress(clock, "b", {0: 90, 1: 15}, 30)
    status = derive_status(job, [killed, taker])
    assert status.finished_offsets == 90 + (20 - 10)


def test_a_terminal_record_wins_and_completed_counts_the_whole_range() -> None:
    clock = FakeClock()
    final = JobCounts(done=149, failed=1)
    job = _job(clock).with_state("completed", clock() + 9, counts=final)
    status = derive_status(job, [])
    assert (status.state, status.finished_offsets, status.counts) == ("completed", 150, final)
    later = [_progress(clock, "a", {0: 100}, 100, state="stopped"), _progress(clock, "b", {}, 50)]
    assert derive_status(job, later).counts == JobCounts(done=150)  # the members' latest
    cancelled = _job(clock).with_state("cancelled", clock(), reason="by hand")
    status = derive_status(cancelled, [_progress(clock, "a", {0: 10}, 10)])
    assert (status.state, status.reason, status.counts.done) == ("cancelled", "by hand", 10)


@pytest.mark.parametrize(
    ("done", "failed", "skipped", "state"),
    [
        (0, 12, 0, "failed"),  # every record failed: a --text-field no record has
        (0, 12, 3, "failed"),  # what was scored failed; the skipped were finished earlier
        (1, 12, 0, "completed"),  # failures among ok records show in the counts
        (150, 0, 0, "completed"),
        (0, 0, 150, "completed"),  # an earlier run had finished everything
        (0, 0, 0, "completed"),  # an empty range
    ],
)
def test_a_job_ends_failed_when_every_record_failed(
    done: int, failed: int, skipped: int, state: str
) -> None:
    counts = JobCounts(done=done, failed=failed, skipped=skipped)
    ended, reason = end_state(counts)
    assert ended == state
    assert (reason is None) == (state == "completed")
    if reason is not None:
        assert reason == f"every record failed ({failed} error replies or dead letters, none ok)"


def test_a_completed_record_whose_every_record_failed_is_shown_failed() -> None:
    """Regression: a job in which every record failed ended ``completed``, in ``status`` and in
    ``--json``; a record a member wrote so (before the rule) is shown ``failed`` with why."""
    from consumer.jobs.render import status_json

    clock = FakeClock()
    job = _job(clock).with_state("completed", clock(), counts=JobCounts(failed=150))
    members = [_progress(clock, "a", {0: 100, 1: 60}, 0, failed=150, state="stopped")]
    for status in (derive_status(job, members), derive_status(job, [])):
        assert status.state == "failed"
        assert status.reason is not None and status.reason.startswith("every record failed")
        assert status.finished_offsets == 150  # the range was read to its end
        assert status_json(status)["state"] == "failed"
    partly = job.with_state("completed", clock(), counts=JobCounts(done=1, failed=149))
    assert derive_status(partly, []).state == "completed"


def test_an_empty_range_is_complete_progress() -> None:
    clock = FakeClock()
    status = derive_status(_job(clock, ranges={0: (7, 7)}), [])
    assert (status.total_offsets, status.fraction) == (0, 1.0)


def test_the_table_keeps_the_latest_value_per_key_and_honours_tombstones() -> None:
    clock = FakeClock()
    table = JobTable()
    job = _job(clock)
    table.apply(record_key("job-1"), encode_record(job))
    table.apply(record_key("job-1", "a"), encode_record(_progress(clock, "a", {0: 10}, 10)))
    table.apply(record_key("job-1", "a"), encode_record(_progress(clock, "a", {0: 20}, 20)))
    assert table.status("job-1").counts.done == 20
    table.apply(record_key("job-1"), encode_record(job.with_state("cancelled", clock())))
    assert [s.state for s in table.statuses()] == ["cancelled"]
    table.apply(record_key("job-1", "a"), None)
    assert table.members_of("job-1") == []
    table.apply(record_key("job-1"), None)
    assert table.statuses() == []


def test_the_table_refuses_a_key_that_does_not_match_its_record() -> None:
    clock = FakeClock()
    table = JobTable()
    with pytest.raises(RecordError, match="does not match"):
        table.apply(b"job-2", encode_record(_job(clock)))
    with pytest.raises(RecordError, match="without a key"):
        table.apply(None, encode_record(_job(clock)))
    assert table.jobs == {}


def test_status_table_shows_a_bar_while_running_and_counts_when_ended() -> None:
    from rich.console import Console

    from consumer.jobs.render import render_statuses, status_json

    clock = FakeClock()
    running = derive_status(_job(clock), [_progress(clock, "a", {0: 75}, 75)])
    ended = derive_status(
        _job(clock, job_id="job-2").with_state("failed", clock(), reason="by hand"), []
    )
    console = Console(record=True, width=200, color_system=None, force_terminal=True)
    render_statuses([running, ended], console)
    text = console.export_text()
    assert "━" in text and "75/150 records (50.0 %)" in text  # the bar while running
    assert "0/150 records (0.0 %)" in text and "by hand" in text and "failed" in text
    # 40 columns: nothing cut (the counts were shown as `3…` in the old
    # eight-column table, then the id cut at 60 columns)
    narrow = Console(record=True, width=40, color_system=None, force_terminal=True)
    render_statuses([running, ended], narrow)
    lines = narrow.export_text().splitlines()
    assert "…" not in "".join(lines)
    assert "job-1" in lines  # the id whole, on its own line (cancel takes it)
    piped = Console(record=True, width=80, color_system=None, force_terminal=False)
    render_statuses([running], piped)
    plain = piped.export_text()
    assert "  running 75/150 records (50.0 %)" in plain.splitlines()  # no bar in a pipe
    assert "  done 75 · failed 0 · skipped 0" in lines
    assert any(line.startswith("  members: a running") for line in lines)
    assert "  members: none" in lines  # the failed job that never ran: not "none yet"
    assert status_json(running)["fraction"] == 0.5
    assert status_json(running)["committed_fraction"] == 0.5
    empty = Console(record=True)
    render_statuses([], empty)
    assert "no jobs" in empty.export_text()


@pytest.mark.parametrize(
    ("state", "positions", "counts", "headline", "committed"),
    [
        # a low offset still unanswered holds the commit back while thousands are done
        ("running", {0: 12}, {"done": 2600, "failed": 40, "skipped": 20},
         "  running 2660/8000 records (33.2 %)", "  committed 12/8000 offsets (0.1 %;"),
        ("running", {0: 4000}, {"done": 4000}, "  running 4000/8000 records (50.0 %)",
         "  committed 4000/8000 offsets (50.0 %;"),
        # counted twice after a member's crash: never past the range
        ("running", {0: 7000}, {"done": 8100}, "  running 8000/8000 records (100.0 %)",
         "  committed 7000/8000 offsets (87.5 %;"),
        # compaction gaps: fewer records than offsets, and yet the whole range is done
        ("completed", {0: 8000}, {"done": 7900}, "  completed 8000/8000 records (100.0 %)", None),
    ],
)  # fmt: skip
def test_status_headlines_records_processed_of_the_range(
    state: str, positions: dict[int, int], counts: dict[str, int], headline: str,
    committed: str | None,
) -> None:  # fmt: skip
    from rich.console import Console

    from consumer.jobs.render import render_statuses, status_json

    clock = FakeClock()
    job = _job(clock).model_copy(update={"ranges": {0: (0, 8000)}})
    if state == "completed":
        job = job.with_state("completed", clock())
    status = derive_status(job, [_progress(clock, "a", positions, **counts)])
    console = Console(record=True, width=80, color_system=None, force_terminal=False)
    render_statuses([status], console)
    lines = console.export_text().splitlines()
    assert headline in lines
    shown = [line for line in lines if line.startswith("  committed")]
    assert shown == [] if committed is None else shown[0].startswith(committed)
    assert status_json(status)["fraction"] == round(status.progress, 4)


def test_a_silent_running_member_is_shown_lost() -> None:
    clock = FakeClock()
    job = _job(clock)
    members = [
        _progress(clock, "dead", {0: 10}, 10),
        _progress(clock, "done", {}, 0, state="stopped"),
    ]
    clock.now_s += 20
    members.append(_progress(clock, "alive", {1: 20}, 10))
    clock.now_s += 15  # dead: 35 s silent, alive: 15 s
    shown = derive_status(job, members, now_s=clock()).members
    assert shown == {"alive": "running", "dead": "lost", "done": "stopped"}
    assert derive_status(job, members).members["dead"] == "running"  # no clock: never lost
