"""A local single-node Apache Kafka broker (KRaft combined mode) for development and tests.

No Docker engine is needed: the broker's jars come from Maven Central through the
``pom.xml`` beside this file (``org.apache.kafka:kafka_2.13`` plus an SLF4J 1.x binding:
Log4j 2 for Kafka 4.x, reload4j for 3.x), copied once into
``~/.cache/kbatch/kafka/<version>/libs``. Data, logs and the pid file live in
``~/.cache/kbatch/broker-<port>/``. ``KBATCH_CACHE_DIR`` moves the whole cache.

:data:`KAFKA_VERSION` (4.4.0) is the default: the newest Kafka on Maven Central with which
the whole suite passes, transactions included, with aiokafka 0.14. 3.9.x stays selectable
(``kbatch broker start --kafka-version 3.9.1``); ``tests/integration/test_broker_kafka3.py``
runs the round trip, a consumer group and a transaction against it.

Errors raised: :class:`BrokerError` with a one-line message that says what to do.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from consumer.lifecycle import process_running

KAFKA_VERSION: Final = "4.4.0"
KAFKA3_VERSION: Final = "3.9.1"
DEFAULT_PORT: Final = 9092
START_TIMEOUT_S: Final = 90.0
STOP_TIMEOUT_S: Final = 30.0
HEAP_OPTS: Final = ("-Xms256m", "-Xmx512m")
_ALTERNATIVE: Final = "or use docker-compose.yml (`docker compose up kafka`) where Docker runs"


class BrokerError(RuntimeError):
    """The local broker cannot be set up, started or stopped; the message says what to do."""


def cache_root() -> Path:
    """The kbatch cache directory (``$KBATCH_CACHE_DIR`` or ``~/.cache/kbatch``)."""
    return Path(os.environ.get("KBATCH_CACHE_DIR", Path.home() / ".cache" / "kbatch"))


def port_is_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _server_properties(port: int, controller_port: int, data_dir: Path) -> str:
    """The single-node KRaft settings: one replica for every internal topic."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            *single_node_storage(data_dir),
            "",
        ]
    )


def single_node_storage(data_dir: Path) -> list[str]:
    """The storage and internal-topic settings every single-node broker shares (plain and
    ``--secure``): one replica of each internal topic, no topic created on first use."""
    return [
        f"log.dirs={data_dir}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=10",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=4",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",  # kbatch creates its topics with explicit partitions
        "delete.topic.enable=true",
        "log.segment.bytes=67108864",
    ]


# Kafka 3.x: reload4j (log4j 1.x syntax) through -Dlog4j.configuration.
_LOG4J = """\
log4j.rootLogger=WARN, file
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File={log_file}
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
"""

# Kafka 4.x: Log4j 2 (properties syntax) through -Dlog4j2.configurationFile.
_LOG4J2 = """\
status=warn
appender.file.type=RollingFile
appender.file.name=file
appender.file.fileName={log_file}
appender.file.filePattern={log_file}.%i
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
appender.file.policies.type=Policies
appender.file.policies.size.type=SizeBasedTriggeringPolicy
appender.file.policies.size.size=20MB
appender.file.strategy.type=DefaultRolloverStrategy
appender.file.strategy.max=2
rootLogger.level=WARN
rootLogger.appenderRef.file.ref=file
logger.kafka.name=kafka
logger.kafka.level=INFO
logger.apache.name=org.apache.kafka
logger.apache.level=INFO
"""


def kafka_major(version: str) -> int:
    """The major version of a Kafka release string: ``"4.4.0"`` → 4.

    Raises:
        BrokerError: the string is not ``MAJOR.MINOR.PATCH`` with a supported major (3 or 4).
    """
    match = re.fullmatch(r"(\d+)\.\d+\.\d+", version)
    if match is None or int(match.group(1)) not in (3, 4):
        raise BrokerError(f"unsupported Kafka version {version!r}: use 4.x.y (default) or 3.9.x")
    return int(match.group(1))


@dataclass(frozen=True)
class LocalBroker:
    """One local broker on ``127.0.0.1:port`` with its controller on ``controller_port``.

    The controller listener defaults to ``port + 1``. All methods are synchronous and safe to
    call repeatedly: :meth:`start` on a running broker only prints its address.
    """

    port: int = DEFAULT_PORT
    controller_port: int | None = None
    kafka_version: str = KAFKA_VERSION

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use, ``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def _controller_port(self) -> int:
        return self.controller_port if self.controller_port is not None else self.port + 1

    @property
    def home(self) -> Path:
        """``<cache>/broker-<port>``: server.properties, data/, logs/, broker.pid."""
        return cache_root() / f"broker-{self.port}"

    @property
    def libs_dir(self) -> Path:
        """Where the jars of ``kafka_version`` are copied once."""
        return cache_root() / "kafka" / self.kafka_version / "libs"

    @property
    def _log4j2(self) -> bool:
        return kafka_major(self.kafka_version) >= 4

    @property
    def log_file(self) -> Path:
        """The broker's own log (server log4j output)."""
        return self.home / "logs" / "server.log"

    # ---- jars ---------------------------------------------------------------------------

    def ensure_jars(self) -> Path:
        """Fetch the broker's jars with Maven once; returns the libs directory.

        Raises:
            BrokerError: ``java`` or ``mvn`` is missing, or Maven fails.
        """
        marker = self.libs_dir / ".complete"
        if marker.exists():
            return self.libs_dir
        if shutil.which("java") is None:
            raise BrokerError(
                f"`java` not found: install a JDK 17+ (e.g. openjdk-17-jre), {_ALTERNATIVE}"
            )
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(f"`mvn` not found: install Apache Maven, {_ALTERNATIVE}")
        self.libs_dir.mkdir(parents=True, exist_ok=True)
        pom = resources.files("consumer.broker").joinpath("pom.xml")
        with resources.as_file(pom) as pom_path:
            cmd = [
                mvn, "-q", "-B", "-f", str(pom_path),
                f"-Dkafka.version={self.kafka_version}",
                f"-Dkafka.logging={'log4j2' if self._log4j2 else 'reload4j'}",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={self.libs_dir}",
            ]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise BrokerError(
                f"Maven could not fetch Kafka {self.kafka_version}: {' | '.join(tail)}"
            )
        marker.write_text(self.kafka_version)
        return self.libs_dir

    # ---- process ------------------------------------------------------------------------

    def pid(self) -> int | None:
        """The broker's pid when its process is alive, else None."""
        try:
            pid = int((self.home / "broker.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if process_running(pid) else None

    def _java(self, main: str, *args: str, heap: tuple[str, ...] = ()) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise BrokerError(f"`java` not found: install a JDK 17+, {_ALTERNATIVE}")
        if self._log4j2:
            logging = f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}"
        else:
            logging = f"-Dlog4j.configuration=file:{self.home / 'log4j.properties'}"
        return [
            java,
            *heap,
            logging,
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp",
            str(self.libs_dir / "*"),
            main,
            *args,
        ]

    def _properties(self) -> str:
        """The ``server.properties`` text (a cluster node overrides it: ``cluster.py``)."""
        return _server_properties(self.port, self._controller_port, self.home / "data")

    def _cluster_id(self) -> str:
        """The KRaft cluster id formatted into new storage (every node of a cluster shares one)."""
        return new_cluster_id()

    def _write_config(self) -> Path:
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        props = self.home / "server.properties"
        props.write_text(self._properties())
        name, template = (
            ("log4j2.properties", _LOG4J2) if self._log4j2 else ("log4j.properties", _LOG4J)
        )
        (self.home / name).write_text(template.format(log_file=self.log_file))
        return props

    def _format(self, props: Path) -> None:
        """Format the KRaft storage once; record which Kafka version formatted it.

        Raises:
            BrokerError: the data was written by a newer Kafka major than ``kafka_version``
                (a 3.9 broker cannot read a 4.x metadata log), or formatting failed.
        """
        recorded = self.home / "data" / "kbatch-kafka-version"
        if (self.home / "data" / "meta.properties").exists():
            written_by = recorded.read_text().strip() if recorded.exists() else KAFKA3_VERSION
            if kafka_major(written_by) > kafka_major(self.kafka_version):
                raise BrokerError(
                    f"{self.home / 'data'} was written by Kafka {written_by}; Kafka "
                    f"{self.kafka_version} cannot read it: add --fresh to wipe it, or use "
                    "another --port"
                )
            return
        cluster_id = self._cluster_id()
        cmd = self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting the broker's storage failed: {proc.stderr.strip()[-300:]}"
            )
        recorded.write_text(self.kafka_version)

    def start(self, *, fresh: bool = False, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the broker unless it already runs; wait until it answers a metadata request.

        Args:
            fresh: stop it if running and wipe its data first.
            timeout_s: how long to wait for the first metadata answer.

        Returns:
            The bootstrap address.

        Raises:
            BrokerError: a missing tool, a port held by another program, or no answer in time.
        """
        if fresh:
            self.stop()
            shutil.rmtree(self.home / "data", ignore_errors=True)
        if self.pid() is not None:
            self.wait_ready(timeout_s)
            return self.bootstrap
        for port in (self.port, self._controller_port):
            if port_is_open(port):
                raise BrokerError(
                    f"port {port} is taken by another program: stop it or choose another "
                    "port (`kbatch broker start --port N`, `kbatch demo --broker-port N`, or "
                    f"KBATCH_BROKER_PORT=N for both), {_ALTERNATIVE}"
                )
        self.ensure_jars()
        props = self._write_config()
        self._format(props)
        out = (self.home / "logs" / "stdout.log").open("ab")
        proc = subprocess.Popen(
            self._java("kafka.Kafka", str(props), heap=HEAP_OPTS),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the CLI; `kbatch broker stop` ends it
            cwd=self.home,
        )
        out.close()
        (self.home / "broker.pid").write_text(str(proc.pid))
        self.wait_ready(timeout_s, proc=proc)
        return self.bootstrap

    def wait_ready(self, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
        """Poll until the broker :meth:`answers` or ``timeout_s`` passes.

        Raises:
            BrokerError: the process died or did not answer in time.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise BrokerError(f"the broker exited with {proc.returncode}: see {self.log_file}")
            if port_is_open(self.port) and self.answers():
                return
            time.sleep(0.3)
        raise BrokerError(f"the broker did not answer within {timeout_s:.0f}s: see {self.log_file}")

    def answers(self) -> bool:
        """True when the broker answers a metadata request (5 s at most); the secured broker
        asks as its admin over SASL_SSL."""
        return broker_answers_safe(self.bootstrap)

    def status(self) -> bool:
        """True only when the broker on this port :meth:`answers`."""
        return port_is_open(self.port) and self.answers()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop the broker cleanly (SIGTERM, then SIGKILL after ``timeout_s``).

        Returns:
            True when a running broker was stopped, False when none ran.
        """
        pid = self.pid()
        if pid is None:
            return False
        os.killpg(pid, signal.SIGTERM) if _is_group_leader(pid) else os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            _reap(pid)
            time.sleep(0.2)
        if self.pid() is not None:
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
        (self.home / "broker.pid").unlink(missing_ok=True)
        return True

    def kill(self) -> None:
        """SIGKILL the broker (fault-injection tests); its data stays for a restart."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.pid() is not None and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)


def new_cluster_id() -> str:
    """A random KRaft cluster id (22 URL-safe base64 characters of a UUID), never starting with
    ``-``: ``kafka-storage format -t -x…`` reads such an id as a flag (a 1-in-64 failure to
    format; Kafka's own ``Uuid.randomUuid`` skips these ids the same way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def broker_answers_safe(bootstrap: str) -> bool:
    """:func:`consumer.kafka.admin.broker_answers` with a short timeout."""
    from consumer.kafka.admin import broker_answers

    return broker_answers(bootstrap, timeout_s=5.0)


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _reap(pid: int) -> None:
    """Collect a child's exit status so it does not linger as a zombie (no-op otherwise)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
