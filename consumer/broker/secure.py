"""A secured local broker (``kbatch broker start --secure``): TLS, SCRAM, mutual TLS and ACLs,
as a company's cluster has them, for development and the security tests (docs/SECURITY.md).

Listeners on 127.0.0.1 (``port`` defaults to :data:`SECURE_PORT`, beside the plain broker):

=================  ===========  ===================================================
listener           port         who connects
=================  ===========  ===================================================
``SASL_SSL``       ``port``     clients: TLS, then SCRAM-SHA-512 user and password
``CONTROLLER``     ``port + 1`` the KRaft controller (mutual TLS, principal ``broker``)
``MTLS``           ``port + 2`` clients with a certificate (mutual TLS); also the
                                inter-broker listener
=================  ===========  ===================================================

``StandardAuthorizer`` with no ACL meaning no access; super users ``admin`` (SCRAM) and
``broker`` (its own certificate). A certificate's principal is its CN (``CN=kbatch`` →
``User:kbatch``), so a SCRAM user and the holder of its certificate are the same principal.

Created on first start under the broker's cache folder (``<cache>/secure-broker-<port>/``, never in
the repository), all private to the user (0600 files in a 0700 folder):

* ``tls/``: a CA (``ca.pem``), the broker's certificate (CN ``broker``, SAN ``127.0.0.1`` and
  ``localhost``) and one client certificate per user (``<user>.pem``, ``<user>.key``), made
  with the ``openssl`` command line (present wherever a JDK is);
* ``passwords.json``: a random password per SCRAM user (:data:`USERS`), added to the KRaft
  storage when it is formatted (``kafka-storage format --add-scram``).

``kbatch broker env --user NAME`` prints the ``export KBATCH_*`` lines a client needs, password
included, so that no secret goes on a command line: ``eval "$(kbatch broker env --user kbatch)"``.

Errors raised: :class:`consumer.broker.local.BrokerError` with a one-line message.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from consumer.broker.local import BrokerError, LocalBroker, cache_root, single_node_storage

if TYPE_CHECKING:
    from consumer.kafka.config import KafkaClientSettings

SECURE_PORT: Final = 9094
"""Default port of the secured broker's SASL_SSL listener: beside the plain broker, whose
client and controller listeners take 9092 and 9093 (this one then takes 9094-9096)."""

USERS: Final = ("admin", "kbatch", "client")
"""SCRAM users created at format time; ``admin`` is a super user, the others get ACLs."""

SUPER_USERS: Final = ("admin", "broker")
SCRAM_MECHANISM: Final = "SCRAM-SHA-512"
CERT_DAYS: Final = 825


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _openssl(*args: str) -> None:
    """Run ``openssl`` quietly.

    Raises:
        BrokerError: openssl is missing or fails (the message has its last error line).
    """
    exe = shutil.which("openssl")
    if exe is None:
        raise BrokerError("`openssl` not found: install it (e.g. apt-get install openssl)")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BrokerError(f"openssl {args[0]} failed: {tail}")


def make_ca(folder: Path, name: str = "kbatch-local-ca") -> tuple[Path, Path]:
    """A self-signed CA in ``folder``: ``(ca.pem, ca.key)`` (RSA 2048, ten years); kept when
    present."""
    cert, key = folder / "ca.pem", folder / "ca.key"
    if not (cert.exists() and key.exists()):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
            "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        key.chmod(0o600)
    return cert, key


def make_cert(folder: Path, ca: tuple[Path, Path], cn: str) -> tuple[Path, Path]:
    """A certificate for ``cn`` signed by ``ca``, valid for TLS server and client use, naming
    ``127.0.0.1`` and ``localhost``: ``(<cn>.pem, <cn>.key)`` (key unencrypted PKCS#8, 0600);
    kept when present."""
    cert, key = folder / f"{cn}.pem", folder / f"{cn}.key"
    if cert.exists() and key.exists():
        return cert, key
    csr, ext = folder / f"{cn}.csr", folder / f"{cn}.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n"
    )
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
        "-keyout", str(key), "-out", str(csr),
    )  # fmt: skip
    key.chmod(0o600)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-days", str(CERT_DAYS), "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    return cert, key


def _server_properties(broker: SecureBroker, data_dir: Path) -> str:
    tls = broker.tls_dir
    port, cport, mport = broker.port, broker.controller_port_, broker.mtls_port
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{cport}",
            f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport},"
            f"MTLS://127.0.0.1:{mport}",
            f"advertised.listeners=SASL_SSL://127.0.0.1:{port},MTLS://127.0.0.1:{mport}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=MTLS",
            "listener.security.protocol.map=CONTROLLER:SSL,SASL_SSL:SASL_SSL,MTLS:SSL",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={tls / 'broker.keystore.pem'}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={tls / 'ca.pem'}",
            "listener.name.mtls.ssl.client.auth=required",
            "listener.name.controller.ssl.client.auth=required",
            f"sasl.enabled.mechanisms={SCRAM_MECHANISM}",
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users=" + ";".join(f"User:{u}" for u in SUPER_USERS),
            "allow.everyone.if.no.acl.found=false",
            # CN=kbatch → User:kbatch (the SCRAM user of the same name)
            "ssl.principal.mapping.rules=RULE:^CN=([a-zA-Z0-9._-]+)$/$1/,DEFAULT",
            *single_node_storage(data_dir),
            "",
        ]
    )


@dataclass(frozen=True)
class SecureBroker(LocalBroker):
    """The secured single-node broker on ``127.0.0.1:port`` (see the module docstring); start,
    stop and status as :class:`LocalBroker`."""

    port: int = SECURE_PORT
    cache_dir: Path | None = None
    """Where ``secure-broker-<port>/`` lives (default: the kbatch cache; tests use their own).
    Its own folder, never a plain broker's: ``--secure --fresh`` cannot wipe a plain broker."""

    @property
    def home(self) -> Path:
        """``<cache>/secure-broker-<port>``: properties, data, logs, ``tls/``,
        ``passwords.json``."""
        return (self.cache_dir or cache_root()) / f"secure-broker-{self.port}"

    @property
    def controller_port_(self) -> int:
        """The controller listener's port (``port + 1``)."""
        return self.controller_port if self.controller_port is not None else self.port + 1

    @property
    def mtls_port(self) -> int:
        """The mutual-TLS listener's port (``port + 2``)."""
        return self.port + 2

    @property
    def mtls_bootstrap(self) -> str:
        """``127.0.0.1:<port + 2>``."""
        return f"127.0.0.1:{self.mtls_port}"

    @property
    def tls_dir(self) -> Path:
        """The CA, the broker's and the users' certificates and keys."""
        return self.home / "tls"

    @property
    def passwords_file(self) -> Path:
        """The SCRAM users' passwords (JSON, 0600)."""
        return self.home / "passwords.json"

    # ---- credentials -----------------------------------------------------------------------

    def ensure_credentials(self) -> dict[str, str]:
        """Create the CA, the certificates and the passwords unless present; the passwords.

        Raises:
            BrokerError: openssl is missing or fails.
        """
        _private_dir(self.home)
        tls = _private_dir(self.tls_dir)
        ca = make_ca(tls)
        cert, key = make_cert(tls, ca, "broker")
        keystore = tls / "broker.keystore.pem"
        if not keystore.exists():  # Kafka's PEM keystore: the key, then the chain
            fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(key.read_text() + cert.read_text() + ca[0].read_text())
        for user in USERS:
            make_cert(tls, ca, user)
        if not self.passwords_file.exists():
            passwords = {user: secrets.token_urlsafe(24) for user in USERS}
            fd = os.open(self.passwords_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(passwords, out)
        loaded: dict[str, str] = json.loads(self.passwords_file.read_text())
        return loaded

    def password(self, user: str) -> str:
        """``user``'s SCRAM password.

        Raises:
            BrokerError: no such user, or the broker was never started.
        """
        if not self.passwords_file.exists():
            raise BrokerError(
                f"no secured broker was started on port {self.port}: run "
                f"`kbatch broker start --secure --port {self.port}` first"
            )
        passwords: dict[str, str] = json.loads(self.passwords_file.read_text())
        if user not in passwords:
            raise BrokerError(f"unknown user {user!r}: one of {', '.join(USERS)}")
        return passwords[user]

    def client_env(self, user: str, *, mtls: bool = False) -> dict[str, str]:
        """The ``KBATCH_*`` variables a client of ``user`` needs: SCRAM over TLS (password
        included), or with ``mtls`` the user's certificate on the mutual-TLS listener.

        Raises:
            BrokerError: see :meth:`password`.
        """
        env = {"KBATCH_SSL_CAFILE": str(self.tls_dir / "ca.pem")}
        if mtls:
            self.password(user)  # the same checks: started, a known user
            return {
                "KBATCH_BOOTSTRAP": self.mtls_bootstrap,
                "KBATCH_SECURITY_PROTOCOL": "SSL",
                **env,
                "KBATCH_SSL_CERTFILE": str(self.tls_dir / f"{user}.pem"),
                "KBATCH_SSL_KEYFILE": str(self.tls_dir / f"{user}.key"),
            }
        return {
            "KBATCH_BOOTSTRAP": self.bootstrap,
            "KBATCH_SECURITY_PROTOCOL": "SASL_SSL",
            "KBATCH_SASL_MECHANISM": SCRAM_MECHANISM,
            "KBATCH_SASL_USERNAME": user,
            "KBATCH_SASL_PASSWORD": self.password(user),
            **env,
        }

    def client_settings(self, user: str = "admin", *, mtls: bool = False) -> KafkaClientSettings:
        """:meth:`client_env` as settings (the admin's by default, for ACLs and readiness)."""
        from consumer.kafka.config import KafkaClientSettings

        env = self.client_env(user, mtls=mtls)
        fields = {k.removeprefix("KBATCH_").lower(): v for k, v in env.items()}
        return KafkaClientSettings.model_validate(fields)

    # ---- LocalBroker's steps, secured ------------------------------------------------------

    def _write_config(self) -> Path:
        self.ensure_credentials()
        props = super()._write_config()  # log4j files and folders; plain properties replaced
        props.write_text(_server_properties(self, self.home / "data"))
        props.chmod(0o600)
        return props

    def _format(self, props: Path) -> None:
        """Format the KRaft storage once, with the SCRAM users (their passwords travel on the
        one-shot format command's arguments: Kafka reads ``--add-scram`` from there only).

        Raises:
            BrokerError: formatting failed.
        """
        if (self.home / "data" / "meta.properties").exists():
            return
        passwords = self.ensure_credentials()
        scram: list[str] = []
        for user, password in passwords.items():
            scram += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        cmd = self._java(
            "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), *scram
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting the secured broker's storage failed: {proc.stderr.strip()[-300:]}"
            )
        (self.home / "data" / "kbatch-kafka-version").write_text(self.kafka_version)

    def answers(self) -> bool:
        """True when the broker answers a metadata request of the admin over SASL_SSL."""
        from consumer.kafka.admin import broker_answers

        try:
            settings = self.client_settings("admin")
        except Exception:  # never started: not answering
            return False
        return broker_answers(self.bootstrap, timeout_s=5.0, client=settings)
