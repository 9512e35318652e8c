"""``kbatch bench encoding --json``: the report's shape (speed is never asserted)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from consumer.cli import cli


def test_bench_encoding_reports_every_format_per_dim_and_encoding() -> None:
    args = ["bench", "encoding", "--dims", "16,40", "--n", "3", "--rounds", "1", "--json"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for encoding in ("msgpack", "json"):
        for dim in ("16", "40"):
            rows = report[encoding][dim]
            assert sorted(rows) == ["binary", "f16le", "f32le", "float"]
            for row in rows.values():
                assert row["bytes_per_reply"] > 0 and row["us_per_reply"] > 0
    msgpack_40 = report["msgpack"]["40"]
    # f32le carries 4 bytes a value, f16le 2, binary 1 bit: the sizes differ by exactly that
    assert msgpack_40["f32le"]["bytes_per_reply"] - msgpack_40["f16le"]["bytes_per_reply"] == 80
    assert msgpack_40["f16le"]["bytes_per_reply"] - msgpack_40["binary"]["bytes_per_reply"] == (
        80 - 5 + len("f16le") - len("binary")
    )
