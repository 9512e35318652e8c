"""OffsetTracker: tables of (tracked, completed) -> committable, plus property tests.

Like faust's ``_new_offset`` tests: each row is the offsets taken in, the order in which they
finished, and the offset Kafka should be told (the next one to read).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.kafka.offset_metadata import decode_completed, read_completed
from consumer.kafka.offsets import OffsetTracker, TopicPartition

TP: TopicPartition = ("requests", 0)
TP2: TopicPartition = ("requests", 1)


def tracker_with(tracked: list[int], completed: list[int]) -> tuple[OffsetTracker, int]:
    tracker = OffsetTracker()
    gen = tracker.assign(TP)
    for offset in tracked:
        tracker.track(TP, offset)
    for offset in completed:
        tracker.complete(TP, offset, gen)
    return tracker, gen


@pytest.mark.parametrize(
    ("tracked", "completed", "expected"),
    [
        # nothing finished: nothing to commit
        ([], [], None),
        ([0, 1, 2], [], None),
        # in order
        ([0, 1, 2], [0], 1),
        ([0, 1, 2], [0, 1, 2], 3),
        # out of order: the lowest unfinished offset holds the commit back (committed with
        # the finished ones above it in its metadata, even before anything below finished)
        ([0, 1, 2], [1, 2], 0),
        ([0, 1, 2], [2, 0], 1),
        ([0, 1, 2, 3], [3, 1, 0], 2),
        ([0, 1, 2, 3], [3, 2, 1, 0], 4),
        # gaps (compaction, transaction markers): only tracked offsets matter
        ([10, 13, 20], [10], 13),
        ([10, 13, 20], [13, 10], 20),
        ([10, 13, 20], [20, 13, 10], 21),
        ([5, 9], [9], 5),
        # not starting at zero (resumed from a commit)
        ([100, 101], [101, 100], 102),
        # duplicate and unknown completions are ignored
        ([0, 1], [0, 0, 7], 1),
    ],
)
def test_committable_table(tracked: list[int], completed: list[int], expected: int | None) -> None:
    tracker, _ = tracker_with(tracked, completed)
    assert tracker.committable().get(TP) == expected


@pytest.mark.parametrize(
    ("tracked", "completed", "pending"),
    [
        ([], [], 0),
        ([0, 1, 2], [], 3),
        ([0, 1, 2], [1], 2),
        ([0, 1, 2], [0, 1, 2], 0),
        ([0, 4, 9], [9, 9], 2),
    ],
)
def test_pending_counts_unfinished(tracked: list[int], completed: list[int], pending: int) -> None:
    tracker, _ = tracker_with(tracked, completed)
    assert tracker.pending(TP) == pending


def test_complete_reports_whether_applied() -> None:
    tracker, gen = tracker_with([0, 1], [])
    assert tracker.complete(TP, 1, gen) is True
    assert tracker.complete(TP, 1, gen) is False  # already finished
    assert tracker.complete(TP, 5, gen) is False  # never tracked
    assert tracker.complete(TP2, 0, gen) is False  # not assigned


def test_mark_committed_hides_partition_until_progress() -> None:
    tracker, gen = tracker_with([0, 1, 2, 3], [0])
    assert tracker.committable() == {TP: 1}
    tracker.mark_committed({TP: 1})
    assert tracker.committable() == {}
    tracker.complete(TP, 2, gen)  # 1 still unfinished, but 2 joins the commit's metadata
    assert tracker.committable() == {TP: 1}
    tracker.mark_committed({TP: 1})
    assert tracker.committable() == {}
    tracker.complete(TP, 1, gen)
    assert tracker.committable() == {TP: 3}


def test_mark_committed_never_moves_back_and_ignores_unassigned() -> None:
    tracker, _ = tracker_with([0, 1, 2], [0, 1])
    assert tracker.committable() == {TP: 2}
    tracker.mark_committed({TP: 2, TP2: 50})
    tracker.mark_committed({TP: 1})
    assert tracker.committable() == {}
    assert tracker.assigned == frozenset({TP})


def test_committable_covers_only_partitions_with_progress() -> None:
    tracker = OffsetTracker()
    gen1 = tracker.assign(TP)
    tracker.assign(TP2)
    tracker.track(TP, 0)
    tracker.track(TP2, 0)
    tracker.complete(TP, 0, gen1)
    assert tracker.committable() == {TP: 1}


def test_stale_generation_is_ignored_after_reassign() -> None:
    tracker = OffsetTracker()
    old = tracker.assign(TP)
    tracker.track(TP, 0)
    tracker.revoke(TP)
    assert tracker.complete(TP, 0, old) is False  # revoked: ignored
    new = tracker.assign(TP)
    assert new != old
    assert tracker.generation(TP) == new
    tracker.track(TP, 0)
    assert tracker.complete(TP, 0, old) is False  # batch of the earlier assignment
    assert tracker.committable() == {}
    assert tracker.pending(TP) == 1
    assert tracker.complete(TP, 0, new) is True
    assert tracker.committable() == {TP: 1}


def test_generations_are_unique_across_partitions() -> None:
    tracker = OffsetTracker()
    gens = [tracker.assign(TP), tracker.assign(TP2), tracker.assign(TP)]
    assert len(set(gens)) == 3


def test_revoke_forgets_partition() -> None:
    tracker, _ = tracker_with([0, 1], [0])
    tracker.revoke(TP)
    tracker.revoke(TP)  # idempotent
    assert tracker.committable() == {}
    assert tracker.pending(TP) == 0
    assert tracker.generation(TP) is None


def test_track_returns_generation() -> None:
    tracker = OffsetTracker()
    gen = tracker.assign(TP)
    assert tracker.track(TP, 3) == gen


@pytest.mark.parametrize(
    ("tracked", "bad", "error"),
    [
        ([], -1, ValueError),
        ([5], 5, ValueError),
        ([5], 4, ValueError),
    ],
)
def test_track_rejects_bad_offsets(tracked: list[int], bad: int, error: type[Exception]) -> None:
    tracker, _ = tracker_with(tracked, [])
    with pytest.raises(error):
        tracker.track(TP, bad)


def test_track_unassigned_partition_raises() -> None:
    with pytest.raises(KeyError):
        OffsetTracker().track(TP, 0)


@st.composite
def tracked_and_order(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Increasing offsets with random gaps, and a random order in which they all finish."""
    gaps = draw(st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=60))
    start = draw(st.integers(min_value=0, max_value=1000))
    offsets = [start + sum(gaps[: i + 1]) for i in range(len(gaps))]
    return offsets, list(draw(st.permutations(offsets)))


@given(tracked_and_order())
def test_commit_never_passes_an_unfinished_offset(case: tuple[list[int], list[int]]) -> None:
    offsets, order = case
    tracker = OffsetTracker()
    gen = tracker.assign(TP)
    for offset in offsets:
        tracker.track(TP, offset)
    finished: set[int] = set()
    last_commit = -1
    for offset in order:
        assert tracker.complete(TP, offset, gen)
        finished.add(offset)
        commit = tracker.committable().get(TP)
        if commit is None:
            continue
        # every tracked offset below the commit has finished
        assert all(o in finished for o in offsets if o < commit)
        # it is the lowest unfinished offset, or the last + 1 when all finished
        unfinished = [o for o in offsets if o not in finished]
        assert commit == (unfinished[0] if unfinished else offsets[-1] + 1)
        # it moves forward, or stays while the finished set above it grows (its metadata)
        assert commit >= last_commit
        tracker.mark_committed({TP: commit})
        last_commit = commit
        assert tracker.pending(TP) == len(unfinished)


@given(tracked_and_order())
def test_commit_reaches_last_plus_one_when_all_complete(
    case: tuple[list[int], list[int]],
) -> None:
    offsets, order = case
    tracker = OffsetTracker()
    gen = tracker.assign(TP)
    for offset in offsets:
        tracker.track(TP, offset)
    for offset in order:
        tracker.complete(TP, offset, gen)
    assert tracker.committable() == {TP: offsets[-1] + 1}
    assert tracker.pending(TP) == 0


@given(tracked_and_order(), st.data())
def test_stale_completions_never_move_the_commit(
    case: tuple[list[int], list[int]], data: st.DataObject
) -> None:
    offsets, order = case
    tracker = OffsetTracker()
    old = tracker.assign(TP)
    new = tracker.assign(TP)  # reassigned while the old batch ran
    for offset in offsets:
        tracker.track(TP, offset)
    stale = data.draw(st.lists(st.sampled_from(offsets)))
    for offset in stale:
        assert not tracker.complete(TP, offset, old)
    assert tracker.committable() == {}
    assert tracker.pending(TP) == len(offsets)
    for offset in order:
        tracker.complete(TP, offset, new)
    assert tracker.committable() == {TP: offsets[-1] + 1}


# ---- finished offsets above the commit (commit metadata) -------------------------------------


def test_commit_metadata_holds_the_finished_offsets_above_the_commit() -> None:
    tracker, gen = tracker_with([10, 11, 12, 13, 15], [12, 13, 15])
    offsets = tracker.committable()
    assert offsets == {TP: 10}
    encoded = tracker.commit_metadata(offsets)[TP]
    assert decode_completed(encoded.text) == (10, frozenset({12, 13, 15}))
    tracker.complete(TP, 10, gen)
    offsets = tracker.committable()
    assert offsets == {TP: 11}
    assert decode_completed(tracker.commit_metadata(offsets)[TP].text)[1] == {12, 13, 15}
    tracker.complete(TP, 11, gen)
    offsets = tracker.committable()
    assert offsets == {TP: 16}
    assert tracker.commit_metadata(offsets)[TP].text == ""


def test_commit_metadata_truncates_to_the_cap() -> None:
    tracker, _ = tracker_with(list(range(0, 2000, 2)), list(range(2, 2000, 4)))
    offsets = tracker.committable()
    encoded = tracker.commit_metadata(offsets, max_bytes=40)[TP]
    assert encoded.truncated and len(encoded.text) <= 40
    assert decode_completed(encoded.text)[1] == set(range(2, 2000, 4)[: encoded.kept])


def test_offsets_finished_earlier_are_skipped_and_the_commit_passes_them() -> None:
    tracker = OffsetTracker()
    gen = tracker.assign(TP)
    assert tracker.add_completed(TP, [101, 102, 104]) == 3
    tracker.track(TP, 100)  # unfinished at the crash
    assert tracker.skip_completed(TP, 101)
    assert tracker.skip_completed(TP, 102)
    assert not tracker.skip_completed(TP, 103)  # not finished earlier: compute it
    tracker.track(TP, 103)
    assert tracker.pending(TP) == 2
    # still carried in the metadata, 104 too although it has not arrived yet
    offsets = tracker.committable()
    assert offsets == {TP: 100}
    assert decode_completed(tracker.commit_metadata(offsets)[TP].text)[1] == {101, 102, 104}
    tracker.mark_committed(offsets)
    tracker.complete(TP, 100, gen)
    tracker.complete(TP, 103, gen)
    assert tracker.committable() == {TP: 104}  # the skipped ones finished with them
    assert tracker.skip_completed(TP, 104)
    assert tracker.committable() == {TP: 105}
    assert tracker.pending(TP) == 0


def test_add_completed_ignores_offsets_taken_already_and_unassigned_partitions() -> None:
    tracker, _ = tracker_with([5, 6], [])
    assert tracker.add_completed(TP, [4, 6, 7]) == 1  # only 7 is still to come
    assert not tracker.skip_completed(TP, 6)
    assert tracker.add_completed(TP2, [1]) == 0
    assert not tracker.skip_completed(TP2, 1)


def test_a_skipped_offset_below_one_taken_is_a_redelivery() -> None:
    tracker = OffsetTracker()
    tracker.assign(TP)
    tracker.add_completed(TP, [3])
    tracker.track(TP, 5)  # 3 never came (a compaction gap)
    with pytest.raises(ValueError, match="increasing"):
        tracker.skip_completed(TP, 3)


def test_earlier_offsets_in_a_gap_are_forgotten_once_the_commit_passes_them() -> None:
    tracker = OffsetTracker()
    gen = tracker.assign(TP)
    tracker.add_completed(TP, [3, 9])
    tracker.track(TP, 5)
    tracker.complete(TP, 5, gen)
    offsets = tracker.committable()
    assert offsets == {TP: 6}
    assert decode_completed(tracker.commit_metadata(offsets)[TP].text)[1] == {9}
    tracker.mark_committed(offsets)
    assert tracker.committable() == {}


@given(tracked_and_order(), st.data())
def test_a_crash_and_restart_from_the_metadata_repeats_only_unfinished_offsets(
    case: tuple[list[int], list[int]], data: st.DataObject
) -> None:
    """Owner 1 finishes a random part out of order and commits with metadata, then dies;
    owner 2 reads the commit back: it computes exactly what owner 1 had not finished."""
    offsets, order = case
    first = OffsetTracker()
    gen = first.assign(TP)
    for offset in offsets:
        first.track(TP, offset)
    finished = order[: data.draw(st.integers(0, len(order)))]
    for offset in finished:
        first.complete(TP, offset, gen)
    committed = first.committable().get(TP)
    if committed is None:  # nothing finished: owner 2 starts where owner 1 did
        assert not finished
        return
    text = first.commit_metadata({TP: committed})[TP].text
    done_above = read_completed(committed, text)

    second = OffsetTracker()
    gen2 = second.assign(TP)
    second.add_completed(TP, done_above)
    computed = []
    for offset in (o for o in offsets if o >= committed):  # Kafka re-reads from the commit
        if not second.skip_completed(TP, offset):
            second.track(TP, offset)
            computed.append(offset)
    assert computed == [o for o in offsets if o not in set(finished)]
    for offset in computed:
        second.complete(TP, offset, gen2)
    if offsets[-1] >= committed:  # owner 2 took something in: it commits past the last
        assert second.committable() == {TP: offsets[-1] + 1}
