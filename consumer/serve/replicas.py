"""``kbatch serve --replicas N``: N consumer processes of one group on one host, supervised.

One Python process tops out near one core of event loop (decode, buckets, replies, Kafka I/O);
a GPU wants more. The supervisor starts N ``kbatch serve`` child processes (``--replicas 1``,
the same settings) in the same consumer group: the group spreads the request topic's partitions
over them exactly as it does across hosts, and each has its own intake, tokenizer and model copy
(on one GPU: see docs/hosts.md about CUDA MPS).

- **Settings**: the effective settings go to each child as a ``--config`` file (mode 0600, in a
  private runtime directory; ``KBATCH_*`` variables are not passed on, so the file is the whole
  truth; only ``KBATCH_SUPERVISOR_PID``, which is no setting, is set), plus per-replica flags:
  ``--cpu-budget`` (the host's CPU budget split evenly: :func:`cpu_share_per_replica`; each
  replica sizes its thread pools from its share; ``--torch-threads``, when given, travels in
  the settings file and applies per replica),
  ``--group-instance-id`` (:func:`replica_instance_id`: ``<id>-<i>`` when one is given, else
  ``<hostname>-<group>-<i>``, so a replica the supervisor restarts after a kill -9 takes its
  partitions back at once instead of after the session timeout; with a derived id a replica
  leaves the group on SIGTERM unless ``--leave-group-on-shutdown`` is set either way) and an
  internal ``--metrics-port`` on 127.0.0.1. One supervisor per group and host holds the derived
  ids (a lock file, :class:`InstanceLock`); a second one's replicas are dynamic members, warned.
- **Topics**: created, or with ``--no-create-topics`` checked, once here
  (:mod:`consumer.serve.topics`: a missing request topic is waited for, a missing reply or
  dead-letter topic stops the host); a warning when N exceeds the request topic's partition
  count (the extra members get no partition).
- **Signals**: SIGTERM/SIGINT are forwarded to every replica, which drains as ``kbatch serve``
  does; the supervisor waits for all of them (at most ``drain_timeout_s`` +
  :data:`KILL_GRACE_S`, then SIGKILL). A supervisor killed with SIGKILL forwards nothing: each
  replica watches for its death and drains by itself (:mod:`consumer.serve.supervisor_watch`).
- **Restarts**: a replica that exits while no stop was asked for (a crash, a kill, exit 4 of a
  wedged engine: :mod:`consumer.serve.wedge`) is restarted after a capped
  exponential backoff (:class:`RestartPolicy`), logged with its pid; one that fails to start
  (exit 1) before it was ever ready ends the whole host with exit 1.
- **Exit code** (:func:`combined_exit_code`): 0 when every replica drained, 3 when any did not
  (its unanswered records are re-read after a restart), 1 on a start-up failure.
- **Metrics**: the replicas write prometheus-client's multiprocess files
  (``PROMETHEUS_MULTIPROC_DIR`` in a private directory); the supervisor serves them through
  ``MultiProcessCollector`` on ``--metrics-port`` (counters summed over every process that ever
  ran, gauges combined as each one's ``multiprocess_mode`` says), plus its own per-replica
  series ``kbatch_replica_up{replica}`` and ``kbatch_replica_restarts_total{replica}``.
  ``/readyz`` is ready when every replica's is; its detail lists each replica's pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from consumer.config import ServeSettings
from consumer.cpu.budget import cores_text, read_cpu_budget, setting_name
from consumer.kafka.admin import partition_count
from consumer.kafka.client_config import security_kwargs
from consumer.kafka.errors import KafkaUnavailableError, TopicCreationError
from consumer.lifecycle import SUPERVISOR_PID_ENV, process_running
from consumer.serve.topics import prepare_topics

__all__ = [
    "RestartPolicy",
    "RestartState",
    "Supervisor",
    "combined_exit_code",
    "cpu_share_per_replica",
    "default_instance_base",
    "drained_code",
    "exit_action",
    "replica_instance_id",
    "supervise",
]

log = logging.getLogger("kbatch.replicas")

EXIT_DRAIN_DEADLINE = 3
"""A replica's and the supervisor's exit code when a drain ran out of ``drain_timeout_s`` (the
value of ``consumer.serve.app.EXIT_DRAIN_DEADLINE``, which this module may not import: only the CLI
imports the serve wiring; a unit test holds them equal)."""

KILL_GRACE_S = 30.0
"""Seconds past ``drain_timeout_s`` the supervisor waits for a replica's drain and close before
it sends SIGKILL (the replica's own deadline should have ended it long before)."""

POLL_S = 0.5
"""How often the supervisor asks each replica's ``/readyz``."""

PER_REPLICA_FLAGS = frozenset(
    {"replicas", "cpu_budget", "group_instance_id", "metrics_port", "metrics_host"}
)
"""Settings a replica gets as flags (its own value), not from the shared settings file."""


# ---- policy (pure) --------------------------------------------------------------------------


def cpu_share_per_replica(budget_cores: float, replicas: int) -> float:
    """The CPU budget of one replica (its ``--cpu-budget``): the host's budget split evenly,
    ``budget_cores / replicas`` (cores, fractional allowed), so N replicas size their pools
    from their share and never oversubscribe the host or its cgroup quota (docs/CPU.md).
    Each replica then keeps its own cores for its host path (:mod:`consumer.cpu.plan`).

    Raises:
        ValueError: ``replicas`` < 1 or ``budget_cores`` ≤ 0.
    """
    if replicas < 1 or not budget_cores > 0:
        raise ValueError(f"need replicas >= 1 and budget > 0, got {replicas}, {budget_cores}")
    return budget_cores / replicas


INSTANCE_ID_MAX = 249
"""Kafka's longest ``group.instance.id`` (it is validated as a topic name is)."""

_ILLEGAL_ID_CHARS = re.compile(r"[^a-zA-Z0-9._-]")
"""What Kafka refuses in a ``group.instance.id`` (legal: ASCII letters, digits, ``.``, ``_``,
``-``)."""


def default_instance_base(host: str, group: str) -> str:
    """The base of the replicas' static ids when no ``--group-instance-id`` is given:
    ``<host>-<group>`` with every character Kafka refuses in an id replaced by ``_``; a base too
    long for ``-<index>`` is cut and ends in a digest of the whole, so it stays unique. ``host``
    is stable across the replicas' restarts (the host name; a pod's name in Kubernetes)."""
    base = _ILLEGAL_ID_CHARS.sub("_", f"{host}-{group}")
    room = INSTANCE_ID_MAX - 4  # "-" and up to 3 digits of an index below 256
    if len(base) > room:
        digest = hashlib.sha256(f"{host}-{group}".encode()).hexdigest()[:12]
        base = f"{base[: room - 13]}-{digest}"
    return base


def replica_instance_id(base: str | None, index: int) -> str | None:
    """The static membership id (``group.instance.id``) of replica ``index`` (0-based):
    ``<base>-<index>``, so each replica keeps its partitions across its own restarts (a kill -9
    restarted by the supervisor: no rebalance, no wait for the session timeout); None without a
    base (dynamic members)."""
    return None if base is None else f"{base}-{index}"


@dataclass(frozen=True)
class RestartPolicy:
    """Capped exponential backoff between restarts of one replica.

    The n-th consecutive failure waits ``min(max_delay_s, first_delay_s × factor^(n-1))``
    seconds; a replica that ran at least ``stable_after_s`` before it died starts counting
    again from the first.
    """

    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    factor: float = 2.0
    stable_after_s: float = 60.0

    def delay_s(self, failures: int) -> float:
        """Seconds before the restart after ``failures`` (≥ 1) consecutive failures."""
        return min(self.max_delay_s, self.first_delay_s * self.factor ** max(0, failures - 1))


@dataclass
class RestartState:
    """One replica's consecutive failures under a :class:`RestartPolicy`."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    failures: int = 0

    def on_exit(self, ran_s: float) -> float:
        """Count an unexpected exit after ``ran_s`` seconds of running; the seconds to wait
        before the restart."""
        if ran_s >= self.policy.stable_after_s:
            self.failures = 0
        self.failures += 1
        return self.policy.delay_s(self.failures)


ExitAction = Literal["done", "abort", "restart"]


def exit_action(code: int, *, stopping: bool, ever_ready: bool) -> ExitAction:
    """What the supervisor does when a replica exits with ``code``.

    ``done`` while a stop (SIGTERM/SIGINT) is in progress: the replica drained (its code
    counts); ``abort`` for a start-up failure (exit 1, or 2: a setting the replica's own
    command line refused) of a replica never ready since the supervisor started: the whole host
    stops and exits 1 (a bad setting or no broker: restarting would not help); else ``restart``
    (a crash, a kill, an OOM: the group has moved its partitions meanwhile, and the restarted
    replica rejoins).
    """
    if stopping:
        return "done"
    if code in (1, 2) and not ever_ready:
        return "abort"
    return "restart"


def drained_code(code: int, *, ready_since_launch: bool) -> int:
    """The code a replica that exited during a stop counts with: its own once it had been ready
    (its drain's verdict: 0, or 3 past the deadline); 0 when it was still starting (the signal
    found it loading the model, before its handlers: killed, or a ``KeyboardInterrupt`` exit 1,
    with nothing taken in that a restart would not read again)."""
    return code if ready_since_launch else 0


def combined_exit_code(codes: Iterable[int]) -> int:
    """The supervisor's exit code from its replicas' final ones: 1 when any failed to start, 0
    when every one drained, else 3 (:data:`EXIT_DRAIN_DEADLINE`: some records
    were left unanswered and uncommitted, re-read after a restart)."""
    final = list(codes)
    if 1 in final:
        return 1
    if all(c == 0 for c in final):
        return 0
    return EXIT_DRAIN_DEADLINE


# ---- the supervisor (I/O) -------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_ready(port: int) -> dict[str, Any] | None:
    """A replica's ``/readyz`` body (its ``ready`` key says), None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body
    except urllib.error.HTTPError as err:
        with contextlib.suppress(ValueError):
            body = json.loads(err.read())
            return body
        return None
    except (OSError, ValueError):
        return None


SECRET_FIELDS: tuple[str, ...] = ("sasl_password",)
"""Settings never written to the replicas' settings file: a supervisor killed with SIGKILL leaves
the file behind, so secrets reach the replicas by environment (:func:`secret_env`) instead."""


def settings_file_data(settings: ServeSettings) -> dict[str, Any]:
    """The shared settings of every replica as JSON-able data (a YAML ``--config`` file): every
    field but :data:`PER_REPLICA_FLAGS` and :data:`SECRET_FIELDS`."""
    return settings.model_dump(mode="json", exclude={*PER_REPLICA_FLAGS, *SECRET_FIELDS})


def secret_env(settings: ServeSettings) -> dict[str, str]:
    """The :data:`SECRET_FIELDS` as ``KBATCH_*`` variables for the replicas' environment (only
    this user's processes can read another process's environment)."""
    env: dict[str, str] = {}
    for name in SECRET_FIELDS:
        value = getattr(settings, name, None)
        if value is not None:
            env[f"KBATCH_{name.upper()}"] = value.get_secret_value()
    return env


RUNTIME_PREFIX = "kbatch-replicas-"
"""A supervisor's runtime folder (the replicas' settings file and metrics files) is
``<tmp>/kbatch-replicas-<supervisor pid>-<random>``, mode 0700, removed when it stops."""


def sweep_stale_runtimes(tmp: Path) -> list[Path]:
    """Remove the runtime folders in ``tmp`` that supervisors stopped by SIGKILL left behind:
    this user's, named with a supervisor pid that no longer runs, and whose replicas (the pids
    in their metrics files' names, ``gauge_livesum_<pid>.db``) have all exited too: an orphaned
    replica still draining keeps its folder. Returns the folders removed (sorted)."""
    removed = []
    for folder in sorted(tmp.glob(f"{RUNTIME_PREFIX}*-*")):
        owner = folder.name.removeprefix(RUNTIME_PREFIX).split("-", 1)[0]
        with contextlib.suppress(OSError):
            if (
                not owner.isdigit()
                or folder.stat().st_uid != os.getuid()
                or process_running(int(owner))
            ):
                continue
            pids = {f.stem.rsplit("_", 1)[-1] for f in (folder / "metrics").glob("*_*.db")}
            if any(p.isdigit() and process_running(int(p)) for p in pids):
                continue
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


class InstanceLock:
    """An exclusive lock on the derived static ids of one group on this host
    (``<tmp>/kbatch-instance-<uid>-<digest of the base>.lock``, ``flock``): a second supervisor
    of the same group on this host would give its replicas the same ids, and two members under
    one id fence each other (:mod:`consumer.kafka.static_fence`). Released when the process
    ends, however it ends (the kernel drops the lock with the file descriptor)."""

    def __init__(self, base: str, tmp: Path) -> None:
        digest = hashlib.sha256(base.encode()).hexdigest()[:16]  # a name of any group fits
        self.path = tmp / f"kbatch-instance-{os.getuid()}-{digest}.lock"
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it (or the file cannot be made)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        """Give the lock back and remove its file (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()  # while still held: a later supervisor makes a new one
            os.close(fd)


@dataclass
class _Replica:
    index: int
    restarts: RestartState
    port: int = 0
    proc: asyncio.subprocess.Process | None = None
    started_s: float = 0.0
    ready: bool = False
    ever_ready: bool = False
    ready_since_launch: bool = False
    restart_count: int = 0
    final_code: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    relay: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None


class _HostMetrics:
    """The host's ``/metrics``: the replicas' multiprocess files plus the supervisor's own."""

    def __init__(self, multiproc_dir: Path) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=str(multiproc_dir))  # type: ignore[no-untyped-call]
        self.up = Gauge(
            "kbatch_replica_up",
            "1 while the replica's process runs and answers /readyz ready.",
            ["replica"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "kbatch_replica_restarts_total",
            "Restarts of the replica after it exited unexpectedly.",
            ["replica"],
            registry=self.registry,
        )
        self._generate = generate_latest

    def render(self) -> bytes:
        """The text exposition (``HealthServer``'s ``/metrics``)."""
        return bytes(self._generate(self.registry))

    def refresh(self, now_s: float) -> None:
        """Nothing computed here: the replicas refresh their own values."""


class Supervisor:
    """Runs ``settings.replicas`` replicas of ``kbatch serve`` until SIGTERM/SIGINT (see the
    module docstring for what it does and why).

    Args:
        settings: the effective settings (``replicas`` ≥ 1).
        policy: the restart backoff.
        cores: the host's CPU budget in cores (default: :func:`consumer.cpu.budget.read_cpu_budget`
            of this process with ``--cpu-budget``), split evenly over the replicas.
        argv0: how to start ``kbatch`` (default: this interpreter running ``consumer.cli``).
    """

    def __init__(
        self,
        settings: ServeSettings,
        *,
        policy: RestartPolicy | None = None,
        cores: float | None = None,
        argv0: list[str] | None = None,
    ) -> None:
        self.settings = settings
        self.policy = policy or RestartPolicy()
        self.budget = read_cpu_budget(
            settings.cpu_budget, setting_name=setting_name(settings.cpu_budget, os.environ)
        )
        self.cpu_share = cpu_share_per_replica(cores or self.budget.cores, settings.replicas)
        self.argv0 = argv0 or [sys.executable, "-c", "from consumer.cli import main; main()"]
        self.replicas = [_Replica(i, RestartState(self.policy)) for i in range(settings.replicas)]
        self._stop = asyncio.Event()
        self._stopping = False
        self._aborted = False
        self._runtime = Path(tempfile.mkdtemp(prefix=f"{RUNTIME_PREFIX}{os.getpid()}-"))
        self._multiproc = self._runtime / "metrics"
        self._multiproc.mkdir()
        self._settings_file = self._runtime / "settings.yaml"
        self.metrics = _HostMetrics(self._multiproc)
        self.instance_base = settings.group_instance_id
        self._derived_ids = False
        self._lock: InstanceLock | None = None

    def _choose_instance_ids(self) -> None:
        """Static ids for the replicas: the operator's ``--group-instance-id``, else ones derived
        from the host name and the group (:func:`default_instance_base`), unless another
        supervisor of this group on this host holds those (then dynamic members, warned)."""
        s = self.settings
        if s.group_instance_id is not None:
            return
        base = default_instance_base(socket.gethostname(), s.effective_group_id)
        lock = InstanceLock(base, Path(tempfile.gettempdir()))
        if not lock.acquire():
            log.warning(
                "another supervisor on this host runs group %s with the static ids %s-<i> "
                "(%s is locked or cannot be made): these replicas join as dynamic members (a "
                "killed one's partitions wait --session-timeout-ms); give each supervisor its "
                "own --group-instance-id",
                s.effective_group_id, base, lock.path,
            )  # fmt: skip
            return
        self._lock, self.instance_base, self._derived_ids = lock, base, True
        log.info(
            "replicas' static ids %s-<i> (from the host name and the group; "
            "--group-instance-id to choose)",
            base,
        )

    # ---- one replica ------------------------------------------------------------------------

    def _args(self, r: _Replica) -> list[str]:
        s = self.settings
        args = [
            *self.argv0, "serve",
            "--config", str(self._settings_file),
            "--replicas", "1",
            "--cpu-budget", f"{self.cpu_share:.6g}",
            "--metrics-host", "127.0.0.1",
            "--metrics-port", str(r.port),
        ]  # fmt: skip
        instance = replica_instance_id(self.instance_base, r.index)
        if instance is not None:
            args += ["--group-instance-id", instance]
        if self._derived_ids and "leave_group_on_shutdown" not in s.model_fields_set:
            args.append("--leave-group-on-shutdown")  # SIGTERM moves partitions, as before
        return args

    async def _launch(self, r: _Replica) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KBATCH_")}
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self._multiproc)
        env["PYTHONUNBUFFERED"] = "1"
        env[SUPERVISOR_PID_ENV] = str(os.getpid())  # the replica stops when we are gone
        env.update(secret_env(self.settings))  # never in the settings file
        taken = {other.port for other in self.replicas if other is not r}
        r.port = _free_port()
        while r.port in taken:  # the OS may hand out a port another replica is about to bind
            r.port = _free_port()
        r.ready, r.ready_since_launch, r.detail = False, False, {}
        r.proc = await asyncio.create_subprocess_exec(
            *self._args(r),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        r.started_s = time.monotonic()
        log.info("replica %d started (pid %d, internal port %d)", r.index, r.proc.pid, r.port)
        r.relay = asyncio.create_task(self._relay(r.index, r.proc), name=f"replica-{r.index}-log")

    @staticmethod
    async def _relay(index: int, proc: asyncio.subprocess.Process) -> None:
        """Copy a replica's output to the supervisor's stderr, each line tagged with it."""
        assert proc.stdout is not None
        prefix = f"[replica {index}] ".encode()
        while line := await proc.stdout.readline():
            sys.stderr.buffer.write(prefix + line)
            sys.stderr.buffer.flush()

    async def _keep(self, r: _Replica) -> None:
        """Run replica ``r`` until it ends for good: drained, or the host aborted."""
        from prometheus_client.multiprocess import mark_process_dead

        while True:
            if self._stopping:  # stopped before its (re)start
                r.final_code = 0
                return
            await self._launch(r)
            assert r.proc is not None
            if self._stopping:  # the stop came while it was being started
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(signal.SIGTERM)
            code = await r.proc.wait()
            if r.relay is not None:
                await r.relay  # its last lines (EOF follows the exit)
            mark_process_dead(r.proc.pid, str(self._multiproc))  # type: ignore[no-untyped-call]
            r.ready = False
            self.metrics.up.labels(str(r.index)).set(0)
            action = exit_action(code, stopping=self._stopping, ever_ready=r.ever_ready)
            if action == "done":
                # its drain's verdict, or 0 when the signal found it still starting
                r.final_code = drained_code(code, ready_since_launch=r.ready_since_launch)
                log.info("replica %d (pid %d) exited with %d", r.index, r.proc.pid, code)
                return
            if action == "abort":
                r.final_code = 1  # the host's start-up failure, whatever the replica said
                log.error("replica %d (pid %d) failed to start; stopping", r.index, r.proc.pid)
                self._aborted = True
                self.request_stop(signal.SIGTERM)
                return
            delay = r.restarts.on_exit(time.monotonic() - r.started_s)
            log.warning(
                "replica %d (pid %d) exited unexpectedly with %d; restart %d in %.1f s",
                r.index, r.proc.pid, code, r.restart_count + 1, delay,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stopping:
                r.final_code = 0  # nothing in flight: it was down
                return
            r.restart_count += 1
            self.metrics.restarts.labels(str(r.index)).inc()

    async def _watch(self) -> None:
        """Ask every replica's ``/readyz`` every :data:`POLL_S`; note who is ready."""
        while True:
            for r in self.replicas:
                if r.pid is None:
                    continue
                body = await asyncio.to_thread(_get_ready, r.port)
                r.detail = body or {}
                ready = bool(body and body.get("ready"))
                if ready and not r.ready_since_launch:
                    log.info("replica %d (pid %s) ready", r.index, r.pid)
                r.ready = ready
                r.ever_ready = r.ever_ready or ready
                r.ready_since_launch = r.ready_since_launch or ready
                self.metrics.up.labels(str(r.index)).set(1 if ready else 0)
            self.beat()
            await asyncio.sleep(POLL_S)

    def beat(self) -> None:
        """Replaced by the health server's beat once it runs."""

    # ---- the host -----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: ready when every replica is (and no stop is in progress); the detail
        lists each replica's pid, readiness, restarts and assigned partitions."""
        rows = [
            {
                "replica": r.index,
                "pid": r.pid,
                "ready": r.ready,
                "restarts": r.restart_count,
                "assigned_partitions": r.detail.get("assigned_partitions"),
            }
            for r in self.replicas
        ]
        ready = not self._stopping and all(r.ready for r in self.replicas)
        return ready, {"replicas": rows}

    def request_stop(self, sig: signal.Signals) -> None:
        """Forward ``sig`` to every running replica and stop restarting them."""
        if not self._stopping:
            log.info("%s: draining %d replicas", sig.name, len(self.replicas))
        self._stopping = True
        self._stop.set()
        for r in self.replicas:
            if r.proc is not None and r.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(sig)

    async def _prepare_topics(self) -> None:
        s = self.settings
        await prepare_topics(s)
        partitions = await partition_count(s.bootstrap, s.request_topic, security_kwargs(s))
        if partitions is not None and s.replicas > partitions:
            log.warning(
                "--replicas %d exceeds the %d partitions of %s: %d replicas will get no partition",
                s.replicas, partitions, s.request_topic, s.replicas - partitions,
            )  # fmt: skip

    async def run(self) -> int:
        """Start the replicas, supervise them until a signal, wait for their drains; the exit
        code (:func:`combined_exit_code`)."""
        from consumer.serve.metrics import HealthServer

        s = self.settings
        if swept := sweep_stale_runtimes(Path(tempfile.gettempdir())):
            names = ", ".join(str(f) for f in swept)
            log.info("removed %d folder(s) left by killed supervisors: %s", len(swept), names)
        try:
            await self._prepare_topics()
        except (KafkaUnavailableError, TopicCreationError) as err:
            log.error("%s", err)
            shutil.rmtree(self._runtime, ignore_errors=True)
            return 1
        self._choose_instance_ids()
        fd = os.open(self._settings_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(settings_file_data(s), f)  # JSON is YAML
        health = None
        if s.metrics_port:
            health = HealthServer(self.metrics, self.readiness, s.metrics_host, s.metrics_port)
            health.start()
            self.beat = health.beat  # type: ignore[method-assign]
            log.info("host metrics on http://%s:%d/metrics", s.metrics_host, health.port)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig)
        log.info(
            "supervising %d replicas of group %s (a CPU budget of %s each; the host's: %s)",
            s.replicas, s.effective_group_id, cores_text(float(f"{self.cpu_share:.3g}")),
            self.budget.describe(),
        )  # fmt: skip
        watcher = asyncio.create_task(self._watch(), name="replicas-watch")
        keepers = [
            asyncio.create_task(self._keep(r), name=f"replica-{r.index}") for r in self.replicas
        ]
        try:
            await self._stop.wait()
            _, late = await asyncio.wait(keepers, timeout=s.drain_timeout_s + KILL_GRACE_S)
            for r in self.replicas:
                if r.proc is not None and r.proc.returncode is None:
                    log.error("replica %d (pid %d) still running: SIGKILL", r.index, r.proc.pid)
                    r.proc.kill()
            await asyncio.gather(*late, return_exceptions=True)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            if health is not None:
                health.stop()
            if self._lock is not None:
                self._lock.release()
            shutil.rmtree(self._runtime, ignore_errors=True)
        code = combined_exit_code(
            EXIT_DRAIN_DEADLINE if r.final_code is None else r.final_code for r in self.replicas
        )
        if self._aborted:
            code = 1
        log.info("stopped (exit %d)", code)
        return code


async def supervise(settings: ServeSettings) -> int:
    """``kbatch serve --replicas N`` (N > 1): run a :class:`Supervisor`; its exit code."""
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return await Supervisor(settings).run()
