"""The ``kb1`` commit-metadata codec: tables of known texts, round trips, truncation, and
tolerance of foreign or corrupt strings."""

from __future__ import annotations

import base64
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.kafka.offset_metadata import (
    MAX_METADATA_BYTES,
    PREFIX,
    MetadataError,
    decode_completed,
    encode_completed,
    read_completed,
)


def payload(text: str) -> bytes:
    return base64.b64decode(text[len(PREFIX) :])


@pytest.mark.parametrize(
    ("base", "done", "kind", "body"),
    [
        # one run: 10 not done (100..109), 5 done (110..114): run-length wins the tie
        (100, [110, 111, 112, 113, 114], 0, bytes([10, 5])),
        # two runs
        (0, [1, 50, 51], 0, bytes([1, 1, 48, 2])),
        # close together: the bitmap is shorter (bits 1, 5, 6 → 0b01100010)
        (0, [1, 5, 6], 1, bytes([0b01100010])),
        # dense alternation: the bitmap is shorter (bits 1,3,5,...,15 → 0xAA 0xAA)
        (0, list(range(1, 16, 2)), 1, bytes([0xAA, 0xAA])),
        # a varint over 127: gap of 200 → 0xC8 0x01
        (7, [207], 0, bytes([0xC8, 0x01, 1])),
    ],
)
def test_known_encodings(base: int, done: list[int], kind: int, body: bytes) -> None:
    encoded = encode_completed(base, done)
    data = payload(encoded.text)
    assert data[0] == kind
    # the base as a varint, then the body
    assert data[1:] == _varint(base) + body
    assert decode_completed(encoded.text) == (base, frozenset(done))
    assert encoded.kept == len(done) and not encoded.truncated


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_nothing_above_the_base_is_the_empty_string() -> None:
    assert encode_completed(10, []).text == ""
    assert encode_completed(10, [3, 10]).text == ""  # at or below the base: covered already
    assert read_completed(10, "") == frozenset()
    assert read_completed(10, None) == frozenset()


def test_negative_base_is_refused() -> None:
    with pytest.raises(ValueError, match="base"):
        encode_completed(-1, [1])


offset_sets = st.tuples(
    st.integers(0, 2**40),
    st.lists(st.integers(1, 50_000), max_size=400, unique=True),
)


@given(offset_sets)
def test_round_trip_within_the_cap(case: tuple[int, list[int]]) -> None:
    base, relative = case
    done = [base + r for r in relative]
    encoded = encode_completed(base, done)
    assert len(encoded.text) <= MAX_METADATA_BYTES
    assert encoded.text.isascii()
    if not done:
        assert encoded.text == ""
    elif not encoded.truncated:
        assert decode_completed(encoded.text) == (base, frozenset(done))
    else:  # a prefix of the sorted offsets
        _, kept = decode_completed(encoded.text)
        assert sorted(kept) == sorted(done)[: encoded.kept]


@given(
    st.integers(0, 10**6),
    st.lists(st.integers(1, 200_000), min_size=1, max_size=3000, unique=True),
    st.integers(16, 600),
)
def test_truncation_keeps_the_longest_lowest_prefix_that_fits(
    base: int, relative: list[int], cap: int
) -> None:
    done = sorted(base + r for r in relative)
    encoded = encode_completed(base, done, max_bytes=cap)
    assert len(encoded.text) <= cap
    kept = decode_completed(encoded.text)[1] if encoded.text else frozenset()
    assert sorted(kept) == done[: encoded.kept]
    assert encoded.truncated == (encoded.kept < len(done))
    if encoded.truncated:  # one more offset would not have fitted
        assert len(encode_completed(base, done[: encoded.kept + 1]).text) > cap


def test_a_sparse_wide_set_truncates_at_the_default_cap() -> None:
    done = list(range(1, 400_000, 3))  # ~133k offsets, every third one
    encoded = encode_completed(0, done)
    assert encoded.truncated
    assert 0 < encoded.kept < len(done)
    assert len(encoded.text) <= MAX_METADATA_BYTES
    # the bitmap is chosen for a dense set: ~3,000 bytes cover ~24,500 offsets, a third done
    assert payload(encoded.text)[0] == 1
    assert encoded.kept > 8_000


@pytest.mark.parametrize(
    "text",
    [
        "some other tool's note",  # foreign
        "kb2:AAEC",  # a newer version
        "kb1:",  # empty payload
        "kb1:not base64!",
        "kb1:" + base64.b64encode(bytes([9, 0, 1])).decode(),  # unknown kind
        "kb1:" + base64.b64encode(bytes([0, 0x80])).decode(),  # varint runs off the end
        "kb1:" + base64.b64encode(bytes([0, 5, 0, 2])).decode(),  # a done run at the base
        "kb1:" + base64.b64encode(bytes([0, 5, 1, 0])).decode(),  # an empty run
        "kb1:" + base64.b64encode(bytes([1, 5, 0x01])).decode(),  # bitmap: base marked done
        "kb1:" + base64.b64encode(bytes([0, *([0xFF] * 12)])).decode(),  # varint over 64 bits
    ],
)
def test_foreign_or_corrupt_metadata_is_ignored_with_a_warning(
    text: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(MetadataError):
        decode_completed(text)
    with caplog.at_level(logging.WARNING):
        assert read_completed(5, text, where=("t", 0)) == frozenset()
    assert "ignored" in caplog.text and "('t', 0)" in caplog.text


def test_metadata_written_for_another_offset_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    text = encode_completed(100, [105]).text
    assert read_completed(100, text) == frozenset({105})
    with caplog.at_level(logging.WARNING):
        assert read_completed(90, text) == frozenset()  # the offsets were reset since
    assert "written for offset 100" in caplog.text


@given(st.text(max_size=200))
def test_any_string_is_read_without_raising(text: str) -> None:
    done = read_completed(0, text)
    assert all(o > 0 for o in done)


def test_a_trailing_nul_from_confluent_kafka_is_ignored() -> None:
    # confluent-kafka 2.16 commits "kb1:…" with its C string's NUL; aiokafka and Java read it.
    text = encode_completed(10, frozenset({12, 13}), MAX_METADATA_BYTES).text
    assert decode_completed(text + "\x00") == (10, frozenset({12, 13}))
    with pytest.raises(MetadataError):
        decode_completed(text + "\x00\x00")  # one terminator only
