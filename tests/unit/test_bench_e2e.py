"""Pure helpers of ``kbatch bench e2e`` and the ``noop`` model alias."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from consumer.batching.types import InferenceItem, Rejected, TokenizedItem
from consumer.bench.e2e_report import (
    cpu_device_figures,
    cpu_ratios,
    frontier_points,
    frontier_row,
    latency_rate,
    plot_e2e,
    plot_frontier,
    prefill_records,
    ratios,
    replica_ratios,
    seq_per_s,
    variant_key,
    with_thread_shares,
)
from consumer.bench.e2e_workers import raw_reply_value
from consumer.config import ServeSettings
from consumer.model.loader import NOOP_MODEL, resolve_model
from consumer.model.tokenize import WordCountTokenizer
from schemas import headers as H
from schemas.codec import Encoding, decode_reply
from schemas.records import parse_request_record


@pytest.mark.parametrize(
    ("n", "drain_s", "expected"),
    [(1500, 10.0, 150.0), (60, 0.4, 150.0), (3, 0.7, 4.3)],
)
def test_seq_per_s(n: int, drain_s: float, expected: float) -> None:
    assert seq_per_s(n, drain_s) == expected


@pytest.mark.parametrize(("n", "drain_s"), [(0, 1.0), (10, 0.0), (10, -1.0), (10, math.inf)])
def test_seq_per_s_refuses_unmeasured_drains(n: int, drain_s: float) -> None:
    with pytest.raises(ValueError, match="drain_s"):
        seq_per_s(n, drain_s)


@pytest.mark.parametrize(
    ("tput", "fraction", "cap", "expected"),
    [
        (200.0, 0.7, None, 140.0),  # 70 % of the measured throughput
        (10_000.0, 0.7, 600.0, 600.0),  # capped: the load generator shares the cores
        (0.2, 0.7, None, 0.5),  # never below 0.5/s
        (100.0, 1.0, 100.0, 100.0),
    ],
)
def test_latency_rate(tput: float, fraction: float, cap: float | None, expected: float) -> None:
    assert latency_rate(tput, fraction, cap) == expected


@pytest.mark.parametrize(("fraction", "cap"), [(0.0, None), (1.5, None), (0.7, 0.0)])
def test_latency_rate_rejects_bad_arguments(fraction: float, cap: float | None) -> None:
    with pytest.raises(ValueError):
        latency_rate(100.0, fraction, cap)


def test_ratios_divide_throughputs_and_leave_missing_sides_none() -> None:
    report = {
        "naive": {"seq_per_s": 80.0},
        "kbatch": {"seq_per_s": 240.0},
        "kbatch_eos": {"seq_per_s": 180.0},
        "kbatch_bf16": {"seq_per_s": 480.0},
        "engine": {"seq_per_s": 250.0},
        "passthrough": {"seq_per_s": 900.0},
        "passthrough_trace100": {"seq_per_s": 720.0},
        "kbatch_confluent": {"seq_per_s": 360.0},
    }
    assert ratios(report) == {
        "ratio_kbatch_vs_naive": 3.0,
        "ratio_kbatch_vs_engine": 0.96,
        "ratio_kbatch_confluent_vs_kbatch": 1.5,
        "ratio_kbatch_eos_vs_kbatch": 0.75,
        "ratio_kbatch_eos_confluent_vs_kbatch_eos": None,
        "ratio_kbatch_onnx_vs_kbatch": None,
        "ratio_kbatch_onnx_vs_naive": None,
        "ratio_kbatch_bf16_vs_kbatch": 2.0,
        "ratio_passthrough_vs_raw": None,
        "ratio_passthrough_confluent_vs_passthrough": None,
        "ratio_passthrough_trace1_vs_passthrough": None,
        "ratio_passthrough_trace100_vs_passthrough": 0.8,
    }


def test_replicated_variants_get_their_own_keys_and_ratios_against_one_replica() -> None:
    assert variant_key("passthrough", 1) == "passthrough"
    assert variant_key("passthrough", 2) == "passthrough_x2"
    report = {
        "passthrough": {"seq_per_s": 6000.0},
        "passthrough_x2": {"seq_per_s": 9000.0},
        "kbatch": {"seq_per_s": 300.0},
    }
    assert replica_ratios(report, (1, 2)) == {
        "ratio_passthrough_x2_vs_x1": 1.5,
        "ratio_kbatch_x2_vs_x1": None,  # kbatch_x2 was not run
    }
    assert replica_ratios(report, (1,)) == {}


def test_cpu_and_device_figures() -> None:
    # 10,000 records drained in 2 s with 1.5 CPU s; 2 replicas' devices slept 3 s in all
    f = cpu_device_figures(10_000, 2.0, 1.5, replicas=2, model_s=3.0)
    assert f["cpu_us_per_record"] == 150.0
    assert f["cpu_cores_busy"] == 0.75
    assert f["device_busy_fraction"] == 0.75  # 3 s of 2 × 2 s
    assert f["device_seq_per_s"] == pytest.approx(3333.3)
    # a never-idle device answers 3,333 records/s; at 150 µs each that is half a core
    assert f["cores_per_device"] == 0.5
    g = cpu_device_figures(100, 1.0, 0.01)
    assert g["cpu_us_per_record"] == 100.0 and g["device_busy_fraction"] is None
    with pytest.raises(ValueError):
        cpu_device_figures(0, 1.0, 1.0)


def test_prefill_records_are_valid_requests_with_unique_keys_and_correlation_ids() -> None:
    records = prefill_records(["hello", "a longer text"], "bench.replies", "run1")
    assert [k for k, _, _ in records] == [b"run1-0", b"run1-1"]
    cids = set()
    for (key, value, headers), text in zip(records, ["hello", "a longer text"], strict=True):
        parsed = parse_request_record(key, value, tuple(headers))
        assert parsed.request.text == text
        assert parsed.address.topic == "bench.replies"
        assert parsed.encoding is Encoding.MSGPACK
        assert parsed.address.correlation_id is not None
        cids.add(parsed.address.correlation_id)
        assert dict(headers)[H.CONTENT_TYPE] == b"application/msgpack"
    assert len(cids) == 2


def test_raw_loop_reply_is_a_valid_ok_reply() -> None:
    reply = decode_reply(raw_reply_value(), Encoding.MSGPACK)
    assert reply.status == "ok"
    assert reply.timing is not None


def test_noop_alias_resolves_to_the_packaged_model_dir_and_reports_noop() -> None:
    path, info = resolve_model(ServeSettings(model=NOOP_MODEL))
    assert (path / "config.json").is_file()  # its max length comes from there
    assert info.name == "noop"


def test_word_count_tokenizer_lengths_and_over_length_policy() -> None:
    tok = WordCountTokenizer(8)
    short, cut, rejected = tok.tokenize(
        [
            InferenceItem(0, "one two three"),
            InferenceItem(1, " ".join(["w"] * 20)),
            InferenceItem(2, " ".join(["w"] * 20), truncate=False),
        ]
    )
    assert isinstance(short, TokenizedItem) and short.n_tokens == 5 and not short.truncated
    assert isinstance(cut, TokenizedItem) and cut.n_tokens == 8 and cut.truncated
    assert len(cut.input_ids) == 8
    assert isinstance(rejected, Rejected) and rejected.error_code == "input_too_long"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    row = {"seq_per_s": 100.0, "p50_ms": 12.0, "p99_ms": 40.0}
    report = {
        "naive": row,
        "kbatch": {**row, "seq_per_s": 300.0},
        "engine": {**row, "p50_ms": None},
        "setup": {"load_fraction": 0.7},
    }
    path = plot_e2e(report, tmp_path / "img")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "sim:1,0.4", "--variants", "naive,kbatch"], "need a model directory"),
        (["--model", "sim:1"], "FIXED_MS,US_PER_TOKEN"),
        (["--replicas", "0,2"], "replica counts"),
        (["--model", "/no/such/dir"], "not a directory"),
        (["--latency-fractions", "0.3,1.5"], "fractions in (0, 1]"),
        (["--latency-rates", "10,0"], "rates > 0"),
        (["--target-p99-ms", "0"], "--target-p99-ms"),
    ],
)
def test_bench_e2e_refuses_bad_model_variant_and_replica_options(
    args: list[str], message: str
) -> None:
    from click.testing import CliRunner

    from consumer.cli import cli

    result = CliRunner().invoke(cli, ["bench", "e2e", *args, "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_naive_worker_answers_a_valid_reply_with_plain_transformers(
    tiny_embed_dir: Path,
) -> None:
    from consumer.bench.e2e_workers import _naive_scorer

    ((key, value, headers),) = prefill_records(["a plain text"], "bench.replies", "n")
    out = _naive_scorer(tiny_embed_dir, threads=1)((key, value, tuple(headers)))
    assert out is not None and out.key == key
    reply = decode_reply(out.value, Encoding.MSGPACK)
    assert reply.status == "ok"
    embedding = reply.result.embedding  # type: ignore[union-attr]
    assert len(embedding) == 32 and math.isclose(sum(x * x for x in embedding), 1.0, rel_tol=1e-4)
    got = dict(out.headers)
    assert got[H.CORRELATION_ID] == dict(headers)[H.CORRELATION_ID]
    assert got[H.STATUS] == b"ok"


@dataclass(frozen=True)
class _Frontier:
    latency_fractions: tuple[float, ...] = ()
    latency_rates: tuple[float, ...] = ()
    max_latency_rate_per_s: float | None = None


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        (_Frontier(), []),
        (_Frontier((0.3, 0.9)), [("0.3x", 60.0), ("0.9x", 180.0)]),
        (_Frontier((0.5,), max_latency_rate_per_s=50.0), [("0.5x", 50.0)]),  # capped
        (_Frontier((0.5,), (25.0, 85.5), 50.0), [("0.5x", 50.0), ("25/s", 25.0), ("85.5/s", 85.5)]),
    ],
)
def test_frontier_points(opts: _Frontier, expected: list[tuple[str, float]]) -> None:
    assert frontier_points(200.0, opts) == expected


def test_frontier_plot_writes_a_png_only_with_points(tmp_path: Path) -> None:
    summary = {
        "latency_ms": {"p50": 10.0, "p99": 30.0},
        "scheduled": 100,
        "timeouts": 0,
        "send_lag_ms": {"p99": 1.0},
        "batch_size_mean": 3.0,
    }
    point = frontier_row("0.5x", 50.0, summary)
    assert point["p99_ms"] == 30.0 and point["stages_ms"] is None
    row = {"seq_per_s": 100.0, "p50_ms": 12.0, "p99_ms": 40.0, "latency_rate_per_s": 70.0}
    assert plot_frontier({"kbatch": row}, tmp_path) is None
    report = {"kbatch": {**row, "frontier": [point]}, "engine": {**row, "frontier": [point]}}
    path = plot_frontier(report, tmp_path / "img")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cpu_per_request_is_split_by_thread_role_in_the_counters_proportions() -> None:
    """kbatch_thread_cpu_seconds_total moves once a second: its shares split the phase's
    measured CPU per request; a role that spent nothing is left out."""
    row = {"point": "1000/s", "cpu_ms_per_request": 0.5}
    before = {"event_loop": 10.0, "model": 2.0, "librdkafka": 1.0, "http": 0.5}
    after = {"event_loop": 13.0, "model": 2.5, "librdkafka": 2.5, "http": 0.5, "tokenizer": 0.0}
    shares = with_thread_shares(row, before, after)["cpu_ms_per_request_by_thread"]
    assert shares == {"event_loop": 0.3, "librdkafka": 0.15, "model": 0.05}
    assert list(shares) == ["event_loop", "librdkafka", "model"]  # the largest first
    assert with_thread_shares(row, None, after)["cpu_ms_per_request_by_thread"] is None
    no_cpu = {**row, "cpu_ms_per_request": None}
    assert with_thread_shares(no_cpu, before, after)["cpu_ms_per_request_by_thread"] is None


def _cpu_point(label: str, cpu_ms: float | None, timeouts: int = 0) -> dict[str, object]:
    return {"point": label, "rate_per_s": 1.0, "cpu_ms_per_request": cpu_ms, "timeouts": timeouts}


def test_cpu_ratios_compare_cpu_per_request_at_each_absolute_rate() -> None:
    report = {
        "kbatch": {
            "frontier": [
                _cpu_point("0.5x", 9.0),  # a fraction of the variant's own drain: not compared
                _cpu_point("100/s", 0.8),
                _cpu_point("1000/s", 0.45),
            ]
        },
        "raw_tokenize": {"frontier": [_cpu_point("100/s", 0.5), _cpu_point("1000/s", 0.3)]},
        "raw_tokenize_confluent": {
            "frontier": [_cpu_point("100/s", 0.2), _cpu_point("1000/s", None)]
        },
        "kbatch_confluent": {"frontier": [_cpu_point("100/s", 0.24), _cpu_point("1000/s", 0.18)]},
    }
    assert cpu_ratios(report) == {
        "cpu_ratio_kbatch_vs_raw_tokenize": {"100/s": 1.6, "1000/s": 1.5},
        "cpu_ratio_kbatch_vs_raw_tokenize_confluent": {"100/s": 4.0, "1000/s": None},
        "cpu_ratio_raw_tokenize_vs_raw_tokenize_confluent": {"100/s": 2.5, "1000/s": None},
        "cpu_ratio_kbatch_confluent_vs_raw_tokenize_confluent": {"100/s": 1.2, "1000/s": None},
        "cpu_ratio_kbatch_confluent_vs_kbatch": {"100/s": 0.3, "1000/s": 0.4},
    }


def test_cpu_ratios_are_none_without_both_sides_or_shared_points() -> None:
    kbatch = {"frontier": [_cpu_point("100/s", 0.8)]}
    assert cpu_ratios({"kbatch": kbatch}) == {
        "cpu_ratio_kbatch_vs_raw_tokenize": None,
        "cpu_ratio_kbatch_vs_raw_tokenize_confluent": None,
        "cpu_ratio_raw_tokenize_vs_raw_tokenize_confluent": None,
        "cpu_ratio_kbatch_confluent_vs_raw_tokenize_confluent": None,
        "cpu_ratio_kbatch_confluent_vs_kbatch": None,
    }
    other_rate = {"frontier": [_cpu_point("200/s", 0.4)]}
    got = cpu_ratios({"kbatch": kbatch, "raw_tokenize": other_rate})
    assert got["cpu_ratio_kbatch_vs_raw_tokenize"] is None
    zero = {"frontier": [_cpu_point("100/s", 0.0)]}  # a loop that used no CPU: no ratio
    assert cpu_ratios({"kbatch": kbatch, "raw_tokenize": zero})[
        "cpu_ratio_kbatch_vs_raw_tokenize"
    ] == {"100/s": None}
    # Requests that timed out cost less than an answer: that side's figure is not compared.
    overloaded = {"frontier": [_cpu_point("100/s", 0.1, timeouts=3)]}
    assert cpu_ratios({"kbatch": kbatch, "raw_tokenize": overloaded})[
        "cpu_ratio_kbatch_vs_raw_tokenize"
    ] == {"100/s": None}
    assert cpu_ratios({"kbatch": overloaded, "raw_tokenize": kbatch})[
        "cpu_ratio_kbatch_vs_raw_tokenize"
    ] == {"100/s": None}


def test_confluent_loop_skips_error_records_and_reads_missing_headers_as_none() -> None:
    from confluent_kafka import KafkaError, Message

    from consumer.bench.e2e_confluent import _polled

    messages = [
        Message(topic="t", partition=0, offset=0, key=b"k1", value=b"v1", headers=[("h", b"x")]),
        Message(topic="t", partition=0, error=KafkaError(KafkaError._PARTITION_EOF)),
        Message(topic="t", partition=0, offset=1, key=None, value=b"v2", headers=None),
    ]
    assert _polled(messages) == [(b"k1", b"v1", [("h", b"x")]), (None, b"v2", [])]


def test_confluent_loop_produces_with_java_compatible_partitioning_and_acks_all() -> None:
    from consumer.bench.e2e_confluent import PRODUCER_CONFIG

    # Java's murmur2 for a key (as aiokafka and kbatch's sink), not librdkafka's CRC32 default
    assert PRODUCER_CONFIG["partitioner"] == "murmur2_random"
    assert PRODUCER_CONFIG["acks"] == "all" and PRODUCER_CONFIG["enable.idempotence"] is True


def test_tokenize_scorer_answers_each_record_of_a_poll_with_its_key_and_correlation_id() -> None:
    from consumer.bench.e2e_workers import _tokenize_scorer
    from consumer.model.loader import resolve_model

    model_dir, _ = resolve_model(ServeSettings(model=NOOP_MODEL))  # the packaged MiniLM
    records = prefill_records(["one text", "another, longer text"], "bench.replies", "t")
    out = _tokenize_scorer(model_dir)([(k, v, tuple(h)) for k, v, h in records])
    assert [o.key for o in out] == [b"t-0", b"t-1"]
    for o, (_, _, headers) in zip(out, records, strict=True):
        assert dict(o.headers)[H.CORRELATION_ID] == dict(headers)[H.CORRELATION_ID]
        reply = decode_reply(o.value, Encoding.MSGPACK)
        assert reply.status == "ok" and reply.timing is not None
        assert reply.timing.batch_size == 2 and reply.timing.padded_len > 2


def test_the_bench_reads_kbatch_bootstrap_as_serve_and_load_do() -> None:
    """A user who exported KBATCH_BOOTSTRAP for serve and load got a bench against the
    default 127.0.0.1:9092 instead."""
    import click
    from click.testing import CliRunner

    from consumer.cli.bench_inputs import bootstrap_option

    @click.command()
    @bootstrap_option
    def show(bootstrap: str) -> None:
        click.echo(bootstrap)

    runner = CliRunner()
    assert runner.invoke(show, [], env={"KBATCH_BOOTSTRAP": "broker-a:19093"}).output == (
        "broker-a:19093\n"
    )
    assert runner.invoke(show, ["--bootstrap", "b:1"], env={"KBATCH_BOOTSTRAP": "x:2"}).output == (
        "b:1\n"
    )
