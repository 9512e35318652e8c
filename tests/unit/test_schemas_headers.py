"""The one header lookup rule (schemas/headers.py): the last one wins, a null value is absent."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.headers import last_value, last_values


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], None),
        ([("n", b"a")], b"a"),
        ([("n", b"a"), ("n", b"b")], b"b"),
        ([("n", b"a"), ("m", b"x")], b"a"),
        ([("n", b"a"), ("n", None)], None),  # a null last value counts as no header
        ([("n", None), ("n", b"b")], b"b"),
        ([("N", b"a")], None),  # names are case-sensitive
    ],
)
def test_last_value(headers: list[tuple[str, bytes | None]], expected: bytes | None) -> None:
    assert last_value(headers, "n") == expected
    assert last_values(headers).get("n") == expected


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.none() | st.binary(max_size=3)),
        max_size=8,
    )
)
def test_the_one_pass_lookup_agrees_with_the_single_one(
    headers: list[tuple[str, bytes | None]],
) -> None:
    every = last_values(headers)
    for name in ("a", "b", "c"):
        assert every.get(name) == last_value(headers, name)
