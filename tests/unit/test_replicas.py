"""The supervisor's policy of ``kbatch serve --replicas``: pure functions, a fake clock."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from consumer.config import ServeSettings, load_settings
from consumer.serve.replicas import (
    INSTANCE_ID_MAX,
    PER_REPLICA_FLAGS,
    RUNTIME_PREFIX,
    RestartPolicy,
    RestartState,
    Supervisor,
    combined_exit_code,
    cpu_share_per_replica,
    default_instance_base,
    drained_code,
    exit_action,
    replica_instance_id,
    secret_env,
    settings_file_data,
    sweep_stale_runtimes,
)


@pytest.mark.parametrize(
    ("budget", "replicas", "share"),
    [(8, 2, 4), (2, 2, 1), (2, 4, 0.5), (16, 3, 16 / 3), (0.002, 5, 0.0004), (1, 1, 1)],
)
def test_the_cpu_budget_is_split_evenly_over_replicas(
    budget: float, replicas: int, share: float
) -> None:
    assert cpu_share_per_replica(budget, replicas) == share


def test_a_replica_share_needs_a_budget_and_a_replica() -> None:
    with pytest.raises(ValueError, match="replicas >= 1"):
        cpu_share_per_replica(2, 0)
    with pytest.raises(ValueError, match="budget > 0"):
        cpu_share_per_replica(0, 2)


def test_instance_ids_are_derived_per_replica() -> None:
    assert [replica_instance_id("host-a", i) for i in range(3)] == [
        "host-a-0",
        "host-a-1",
        "host-a-2",
    ]
    assert replica_instance_id(None, 1) is None


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(first_delay_s=0.5, max_delay_s=4.0, factor=2.0)
    assert [policy.delay_s(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_restart_state_counts_consecutive_failures_and_forgets_after_a_stable_run() -> None:
    state = RestartState(RestartPolicy(first_delay_s=1.0, max_delay_s=30.0, stable_after_s=60.0))
    delays = [state.on_exit(ran_s) for ran_s in (2.0, 3.0, 1.0)]  # a crash loop: short runs
    assert delays == [1.0, 2.0, 4.0]
    assert state.on_exit(ran_s=61.0) == 1.0  # ran long enough: back to the first delay
    assert state.failures == 1


@pytest.mark.parametrize(
    ("code", "stopping", "ever_ready", "action"),
    [
        (0, True, True, "done"),
        (3, True, True, "done"),
        (-15, True, False, "done"),
        (1, False, False, "abort"),  # a start-up failure: restarting would not help
        (1, False, True, "restart"),  # it served once (e.g. broker down later): keep trying
        (2, False, False, "abort"),  # a setting its command line refused (usage error)
        (-9, False, True, "restart"),  # SIGKILL, OOM killer
        (0, False, True, "restart"),  # exited without being asked to
        (-11, False, False, "restart"),
        (4, False, True, "restart"),  # a wedged engine (consumer/serve/wedge.py): a fresh one
        (4, False, False, "restart"),
    ],
)
def test_exit_action(code: int, stopping: bool, ever_ready: bool, action: str) -> None:
    assert exit_action(code, stopping=stopping, ever_ready=ever_ready) == action


@pytest.mark.parametrize(
    ("codes", "exit_code"),
    [([0, 0], 0), ([0, 3], 3), ([3, 3], 3), ([0, -9], 3), ([1, 0], 1), ([3, 1], 1), ([0], 0)],
)
def test_combined_exit_code(codes: list[int], exit_code: int) -> None:
    assert combined_exit_code(codes) == exit_code


@pytest.mark.parametrize(
    ("code", "ready_since_launch", "counted"),
    [(0, True, 0), (3, True, 3), (-9, True, -9), (-15, False, 0), (1, False, 0)],
)
def test_a_replica_stopped_while_starting_counts_as_drained(
    code: int, ready_since_launch: bool, counted: int
) -> None:
    assert drained_code(code, ready_since_launch=ready_since_launch) == counted


def test_the_drain_deadline_exit_code_is_serves() -> None:
    from consumer.serve import app, replicas

    assert replicas.EXIT_DRAIN_DEADLINE == app.EXIT_DRAIN_DEADLINE


def test_replica_settings_file_reproduces_the_settings_but_never_holds_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KBATCH_SASL_PASSWORD", "s3cret")
    settings = load_settings(
        ServeSettings,
        replicas=3,
        max_wait_ms=7.5,
        group_id="g1",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="kbatch",
        metrics_port=9999,
        torch_threads=2,
    )
    data = settings_file_data(settings)
    assert PER_REPLICA_FLAGS.isdisjoint(data)
    assert "s3cret" not in json.dumps(data)  # a SIGKILLed supervisor leaves the file behind
    assert secret_env(settings) == {"KBATCH_SASL_PASSWORD": "s3cret"}  # the replicas' env
    path = tmp_path / "settings.yaml"
    path.write_text(json.dumps(data))
    child = load_settings(ServeSettings, path, replicas=1, metrics_port=1234)
    assert child.max_wait_ms == 7.5 and child.group_id == "g1" and child.replicas == 1
    assert child.sasl_password is not None
    assert child.sasl_password.get_secret_value() == "s3cret"
    expected = settings.model_dump(exclude=set(PER_REPLICA_FLAGS))
    assert child.model_dump(exclude=set(PER_REPLICA_FLAGS)) == expected


def test_replica_arguments_carry_a_cpu_share_instance_id_and_internal_port() -> None:
    settings = load_settings(ServeSettings, replicas=2, group_instance_id="host-a")
    sup = Supervisor(settings, cores=8, argv0=["kbatch"])
    try:
        replica = sup.replicas[1]
        replica.port = 40001
        args = sup._args(replica)
    finally:
        shutil.rmtree(sup._runtime)
    flags = dict(zip(args[2::2], args[3::2], strict=False))
    assert args[:2] == ["kbatch", "serve"]
    assert flags["--replicas"] == "1"
    assert flags["--cpu-budget"] == "4"  # 8 cores over 2 replicas
    assert "--torch-threads" not in flags  # each replica plans its own pools from its share
    assert flags["--group-instance-id"] == "host-a-1"
    assert flags["--metrics-port"] == "40001" and flags["--metrics-host"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("host", "group", "base"),
    [
        ("node-7", "kbatch", "node-7-kbatch"),
        ("kbatch-5d8f9-x2x7q", "orders.embed", "kbatch-5d8f9-x2x7q-orders.embed"),
        ("h", "team a/embed:v2", "h-team_a_embed_v2"),  # Kafka refuses ' ', '/', ':' in an id
    ],
)
def test_without_an_id_the_replicas_ids_come_from_the_host_and_the_group(
    host: str, group: str, base: str
) -> None:
    assert default_instance_base(host, group) == base


def test_a_derived_id_too_long_for_kafka_is_cut_and_stays_unique() -> None:
    a, b = (default_instance_base("h" * 300, g) for g in ("group-a", "group-b"))
    assert a != b
    assert all(len(f"{x}-255") <= INSTANCE_ID_MAX for x in (a, b))


def test_replicas_without_an_id_get_derived_ones_and_leave_on_sigterm() -> None:
    settings = load_settings(ServeSettings, replicas=2, group_id="g1")
    sup = Supervisor(settings, cores=2, argv0=["kbatch"])
    other = Supervisor(settings, cores=2, argv0=["kbatch"])  # a second host supervisor
    explicit = Supervisor(
        load_settings(ServeSettings, replicas=2, group_id="g1", leave_group_on_shutdown=False),
        cores=2,
        argv0=["kbatch"],
    )
    try:
        sup._choose_instance_ids()
        other._choose_instance_ids()  # the ids are taken on this host: dynamic members
        args, other_args = sup._args(sup.replicas[1]), other._args(other.replicas[1])
        assert sup._lock is not None
        sup._lock.release()
        explicit._choose_instance_ids()  # released: the next supervisor takes them
        explicit_args = explicit._args(explicit.replicas[0])
    finally:
        for s in (sup, other, explicit):
            shutil.rmtree(s._runtime)
            if s._lock is not None:
                s._lock.release()
    expected = f"{default_instance_base(socket.gethostname(), 'g1')}-1"
    assert args[args.index("--group-instance-id") + 1] == expected
    assert "--leave-group-on-shutdown" in args  # a SIGTERM moves partitions as before
    assert "--group-instance-id" not in other_args
    assert explicit_args[explicit_args.index("--group-instance-id") + 1].endswith("-g1-0")
    assert "--leave-group-on-shutdown" not in explicit_args  # the operator said no


def test_readiness_needs_every_replica() -> None:
    settings = load_settings(ServeSettings, replicas=2)
    sup = Supervisor(settings, cores=2, argv0=["kbatch"])
    shutil.rmtree(sup._runtime)
    sup.replicas[0].ready = True
    ready, detail = sup.readiness()
    assert not ready
    assert [row["ready"] for row in detail["replicas"]] == [True, False]
    sup.replicas[1].ready = True
    assert sup.readiness()[0]


def test_every_gauge_says_how_replicas_combine() -> None:
    """Under --replicas a gauge left at prometheus-client's default mode ('all') would show one
    series per pid: each gauge of Metrics names its multiprocess_mode."""
    from prometheus_client import Gauge

    from consumer.serve.metrics import Metrics

    metrics = Metrics()
    gauges = {
        name: value._multiprocess_mode
        for name, value in vars(metrics).items()
        if isinstance(value, Gauge)
    }
    assert gauges, "no gauges found"
    assert {name: mode for name, mode in gauges.items() if mode == "all"} == {}
    assert gauges["lag"] == "livemostrecent"
    assert gauges["engine_healthy"] == "livemin"
    assert gauges["in_flight_records"] == "livesum"


def _exited_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _runtime(tmp: Path, supervisor: int, replicas: tuple[int, ...] = ()) -> Path:
    folder = tmp / f"{RUNTIME_PREFIX}{supervisor}-abc123"
    (folder / "metrics").mkdir(parents=True)
    (folder / "settings.yaml").write_text("{}")
    for pid in replicas:
        (folder / "metrics" / f"gauge_livesum_{pid}.db").write_bytes(b"")
    return folder


def test_sweep_removes_what_a_killed_supervisor_left(tmp_path: Path) -> None:
    """kill -9 of a supervisor skips its cleanup: the next one removes the folder, once the
    supervisor and every replica named in its metrics files are gone."""
    import os

    dead = _exited_pid()
    stale = _runtime(tmp_path, dead, replicas=(_exited_pid(),))
    live_supervisor = _runtime(tmp_path, os.getpid())
    draining_orphan = tmp_path / f"{RUNTIME_PREFIX}{dead}-draining"
    (draining_orphan / "metrics").mkdir(parents=True)
    (draining_orphan / "metrics" / f"counter_{os.getpid()}.db").write_bytes(b"")
    unrelated = tmp_path / f"{RUNTIME_PREFIX}notapid-x"
    unrelated.mkdir()
    assert sweep_stale_runtimes(tmp_path) == [stale]
    assert not stale.exists()
    assert live_supervisor.exists() and draining_orphan.exists() and unrelated.exists()
