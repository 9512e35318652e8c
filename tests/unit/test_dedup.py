"""DedupCache: one computation per key, with fake monotonic clock values; a reused key with
another input (contract 1.4)."""

from __future__ import annotations

import pytest

from consumer.serve.dedup import INPUT_DIGEST_BYTES, DedupCache, DedupKind, input_digest

P0 = ("requests", 0)
P1 = ("requests", 1)

Cache = DedupCache[str, str]


def test_first_then_in_flight_then_done() -> None:
    cache: Cache = DedupCache()
    first = cache.begin(b"k", P0, now=0.0, item_id=1)
    assert (first.kind, first.item_id, first.result) == (DedupKind.FIRST, 1, None)
    copy = cache.begin(b"k", P0, now=0.1, item_id=2)
    assert (copy.kind, copy.item_id) == (DedupKind.IN_FLIGHT, 1)
    cache.attach_waiter(b"k", "copy-2")
    assert cache.finish(b"k", "result", now=0.2) == ["copy-2"]
    late = cache.begin(b"k", P0, now=0.3, item_id=3)
    assert (late.kind, late.result) == (DedupKind.DONE, "result")
    assert (cache.in_flight_count, cache.completed_count) == (0, 1)


def test_waiters_come_back_in_arrival_order() -> None:
    cache: Cache = DedupCache()
    cache.begin(b"k", P0, now=0.0, item_id=1)
    for name in ("a", "b", "c"):
        assert cache.begin(b"k", P0, now=0.0, item_id=9).kind is DedupKind.IN_FLIGHT
        cache.attach_waiter(b"k", name)
    assert cache.finish(b"k", "r", now=1.0) == ["a", "b", "c"]


def test_keys_are_independent() -> None:
    cache: Cache = DedupCache()
    assert cache.begin(b"a", P0, now=0.0, item_id=1).kind is DedupKind.FIRST
    assert cache.begin(b"b", P0, now=0.0, item_id=2).kind is DedupKind.FIRST


@pytest.mark.parametrize(
    ("stored_s", "now", "kind"),
    [
        (0.0, 0.0, DedupKind.DONE),
        (0.0, 299.9, DedupKind.DONE),
        (0.0, 300.0, DedupKind.FIRST),  # the window is [stored, stored + ttl)
        (10.0, 309.9, DedupKind.DONE),
        (10.0, 1000.0, DedupKind.FIRST),
    ],
)
def test_ttl_window(stored_s: float, now: float, kind: DedupKind) -> None:
    cache: Cache = DedupCache(ttl_s=300.0)
    cache.begin(b"k", P0, now=stored_s, item_id=1)
    cache.finish(b"k", "r", now=stored_s)
    assert cache.begin(b"k", P0, now=now, item_id=2).kind is kind


def test_hit_does_not_extend_the_window() -> None:
    cache: Cache = DedupCache(ttl_s=10.0)
    cache.begin(b"k", P0, now=0.0, item_id=1)
    cache.finish(b"k", "r", now=0.0)
    assert cache.begin(b"k", P0, now=9.0, item_id=2).kind is DedupKind.DONE
    assert cache.begin(b"k", P0, now=10.0, item_id=3).kind is DedupKind.FIRST


def test_expire_drops_oldest_entries_only() -> None:
    cache: Cache = DedupCache(ttl_s=10.0)
    for i, t in enumerate([0.0, 5.0, 8.0]):
        key = f"k{i}".encode()
        cache.begin(key, P0, now=t, item_id=i)
        cache.finish(key, "r", now=t)
    assert cache.expire(now=15.0) == 2
    assert cache.completed_count == 1
    assert cache.begin(b"k2", P0, now=15.0, item_id=9).kind is DedupKind.DONE


def test_begin_expires_each_entry_on_time_after_earlier_ones_went() -> None:
    # begin() looks for expired entries only once the oldest one can have expired: after
    # the first expiry it must still see the next entry's own deadline, and a key stored
    # again (moved to the end) must not make an older entry live longer.
    cache: Cache = DedupCache(ttl_s=10.0)
    for key, t in ((b"a", 0.0), (b"b", 4.0), (b"c", 6.0)):
        cache.begin(key, P0, now=t, item_id=0)
        cache.finish(key, "r", now=t)
    assert cache.begin(b"a", P0, now=10.0, item_id=1).kind is DedupKind.FIRST
    cache.finish(b"a", "r2", now=10.0)  # stored again, newest now
    assert cache.begin(b"b", P0, now=13.9, item_id=2).kind is DedupKind.DONE
    assert cache.begin(b"b", P0, now=14.0, item_id=3).kind is DedupKind.FIRST
    assert cache.completed_count == 2  # c and a
    assert cache.begin(b"x", P0, now=16.0, item_id=4).kind is DedupKind.FIRST
    assert cache.completed_count == 1  # a, stored at 10
    assert cache.begin(b"a", P0, now=19.9, item_id=5).kind is DedupKind.DONE


@pytest.mark.parametrize(("max_entries", "kept"), [(1, [b"k2"]), (2, [b"k1", b"k2"])])
def test_entry_bound_evicts_oldest(max_entries: int, kept: list[bytes]) -> None:
    cache: Cache = DedupCache(max_entries=max_entries)
    for i in range(3):
        key = f"k{i}".encode()
        cache.begin(key, P0, now=0.0, item_id=i)
        cache.finish(key, "r", now=0.0)
    assert cache.completed_count == max_entries
    for i in range(3):
        key = f"k{i}".encode()
        expected = DedupKind.DONE if key in kept else DedupKind.FIRST
        assert cache.begin(key, P0, now=0.0, item_id=10 + i).kind is expected


def test_fail_answers_waiters_but_caches_nothing() -> None:
    cache: Cache = DedupCache()
    cache.begin(b"k", P0, now=0.0, item_id=1)
    cache.begin(b"k", P0, now=0.0, item_id=2)
    cache.attach_waiter(b"k", "copy")
    assert cache.fail(b"k") == ["copy"]
    assert cache.completed_count == 0
    retry = cache.begin(b"k", P0, now=1.0, item_id=3)
    assert (retry.kind, retry.item_id) == (DedupKind.FIRST, 3)


@pytest.mark.parametrize("end", ["finish", "fail"])
def test_unknown_or_stale_end_is_ignored(end: str) -> None:
    cache: Cache = DedupCache()

    def call(key: bytes, item_id: int | None = None) -> list[str]:
        if end == "finish":
            return cache.finish(key, "r", now=0.0, item_id=item_id)
        return cache.fail(key, item_id=item_id)

    assert call(b"never") == []
    cache.begin(b"k", P0, now=0.0, item_id=7)
    cache.attach_waiter(b"k", "w")
    assert call(b"k", item_id=6) == []  # another item's computation
    assert cache.in_flight_count == 1
    assert call(b"k", item_id=7) == ["w"]
    assert cache.completed_count == (1 if end == "finish" else 0)


def test_attach_waiter_requires_in_flight_key() -> None:
    cache: Cache = DedupCache()
    with pytest.raises(KeyError):
        cache.attach_waiter(b"k", "w")


def test_drop_partition_drops_its_entries_and_returns_waiters() -> None:
    cache: Cache = DedupCache()
    cache.begin(b"done0", P0, now=0.0, item_id=1)
    cache.finish(b"done0", "r", now=0.0)
    cache.begin(b"done1", P1, now=0.0, item_id=2)
    cache.finish(b"done1", "r", now=0.0)
    cache.begin(b"fly0", P0, now=0.0, item_id=3)
    cache.attach_waiter(b"fly0", "w0")
    cache.begin(b"fly1", P1, now=0.0, item_id=4)
    cache.attach_waiter(b"fly1", "w1")

    assert cache.drop_partition(P0) == ["w0"]
    assert (cache.in_flight_count, cache.completed_count) == (1, 1)
    assert cache.begin(b"done0", P0, now=1.0, item_id=5).kind is DedupKind.FIRST
    assert cache.begin(b"fly0", P0, now=1.0, item_id=6).kind is DedupKind.FIRST
    assert cache.begin(b"done1", P1, now=1.0, item_id=7).kind is DedupKind.DONE
    assert cache.begin(b"fly1", P1, now=1.0, item_id=8).kind is DedupKind.IN_FLIGHT
    # the revoked computation finishing late neither answers nor caches anything
    assert cache.finish(b"fly0", "late", now=2.0, item_id=3) == []


@pytest.mark.parametrize(("ttl_s", "max_entries"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_rejects_bad_bounds(ttl_s: float, max_entries: int) -> None:
    with pytest.raises(ValueError):
        DedupCache[str, str](ttl_s=ttl_s, max_entries=max_entries)


# ---- a key reused for another input (contract 1.4) -------------------------------------------

CATS, MARKET = input_digest("cats are great"), input_digest("the stock market crashed")


def test_another_input_while_in_flight_is_reused_and_leaves_the_computation_alone() -> None:
    cache: Cache = DedupCache()
    assert cache.begin(b"k", P0, now=0.0, item_id=1, digest=CATS).kind is DedupKind.FIRST
    other = cache.begin(b"k", P0, now=0.1, item_id=2, digest=MARKET)
    assert (other.kind, other.item_id, other.result) == (DedupKind.REUSED, None, None)
    copy = cache.begin(b"k", P0, now=0.2, item_id=3, digest=CATS)  # a true copy still waits
    assert (copy.kind, copy.item_id) == (DedupKind.IN_FLIGHT, 1)
    cache.attach_waiter(b"k", "copy-3")
    assert cache.in_flight_count == 1
    assert cache.finish(b"k", "cats", now=0.3, item_id=1) == ["copy-3"]  # not the reused one


def test_another_input_after_the_answer_is_reused_within_the_window_only() -> None:
    cache: Cache = DedupCache(ttl_s=10.0)
    cache.begin(b"k", P0, now=0.0, item_id=1, digest=CATS)
    cache.finish(b"k", "cats", now=0.0)
    assert cache.begin(b"k", P0, now=9.9, item_id=2, digest=MARKET).kind is DedupKind.REUSED
    done = cache.begin(b"k", P0, now=9.9, item_id=3, digest=CATS)
    assert (done.kind, done.result) == (DedupKind.DONE, "cats")
    # the window has passed: the other input is computed afresh and now owns the key
    fresh = cache.begin(b"k", P0, now=10.0, item_id=4, digest=MARKET)
    assert (fresh.kind, fresh.item_id) == (DedupKind.FIRST, 4)
    assert cache.begin(b"k", P0, now=10.1, item_id=5, digest=CATS).kind is DedupKind.REUSED


def test_after_a_failure_another_input_is_computed() -> None:
    # errors are not stored, so nothing holds the key for the first input any more
    cache: Cache = DedupCache()
    cache.begin(b"k", P0, now=0.0, item_id=1, digest=CATS)
    cache.fail(b"k", item_id=1)
    assert cache.begin(b"k", P0, now=0.1, item_id=2, digest=MARKET).kind is DedupKind.FIRST


def test_a_reused_key_is_per_dedup_key() -> None:
    cache: Cache = DedupCache()
    cache.begin(b"a", P0, now=0.0, item_id=1, digest=CATS)
    assert cache.begin(b"b", P0, now=0.0, item_id=2, digest=MARKET).kind is DedupKind.FIRST


def test_the_input_digest_tells_every_part_of_the_input_apart() -> None:
    query, docs = "where are offsets?", ["In __consumer_offsets.", "Bananas."]
    digests = [
        input_digest(query, docs),
        input_digest("where are offsets!", docs),  # the query differs
        input_digest(query, ["In __consumer_offsets.", "Apples."]),  # a document differs
        input_digest(query, list(reversed(docs))),  # their order
        input_digest(query, docs[:1]),  # one fewer
        input_digest(query, ["In __consumer_offsets.Bananas."]),  # joined
        input_digest(query, []),
        input_digest(query),  # no documents (another task)
        input_digest(query + "In __consumer_offsets.", docs[1:]),  # a boundary moved
    ]
    assert len(set(digests)) == len(digests)
    assert all(len(d) == INPUT_DIGEST_BYTES for d in digests)
    assert input_digest(query, docs) == input_digest(query, tuple(docs))  # a pure function
    assert input_digest("\ud800") != input_digest("\ud801")  # never raises on a lone surrogate
