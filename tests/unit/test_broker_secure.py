"""The secured local broker's files and settings (consumer/broker/secure.py): certificates and
passwords private to the user, kept across starts; the listeners and the authorizer; the
``kbatch broker env`` lines. openssl runs (well under a second per certificate); no broker."""

from __future__ import annotations

import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from consumer.broker.secure import USERS, SecureBroker, _server_properties
from consumer.cli import cli
from consumer.kafka.config import KafkaClientSettings


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> SecureBroker:
    b = SecureBroker(port=29093, cache_dir=tmp_path_factory.mktemp("cache"))
    b.ensure_credentials()
    return b


def test_credentials_are_private_and_kept(broker: SecureBroker) -> None:
    assert stat.S_IMODE(broker.home.stat().st_mode) == 0o700
    assert stat.S_IMODE(broker.tls_dir.stat().st_mode) == 0o700
    private = [broker.passwords_file, broker.tls_dir / "ca.key", broker.tls_dir / "broker.key"]
    private += [broker.tls_dir / "broker.keystore.pem"]
    private += [broker.tls_dir / f"{u}.key" for u in USERS]
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    first = {u: broker.password(u) for u in USERS}
    assert len(set(first.values())) == 3 and all(len(p) >= 24 for p in first.values())
    assert broker.ensure_credentials() == first  # a second start keeps them


def test_user_certificates_are_signed_by_the_ca_and_name_the_user(broker: SecureBroker) -> None:
    tls = broker.tls_dir
    for name in ("broker", *USERS):
        verify = subprocess.run(
            ["openssl", "verify", "-CAfile", str(tls / "ca.pem"), str(tls / f"{name}.pem")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stderr
        subject = subprocess.run(
            ["openssl", "x509", "-noout", "-subject", "-ext", "subjectAltName",
             "-in", str(tls / f"{name}.pem")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert f"CN = {name}" in subject or f"CN={name}" in subject
        assert "IP Address:127.0.0.1" in subject


def test_server_properties_secure_every_listener(broker: SecureBroker) -> None:
    props = _server_properties(broker, broker.home / "data")
    lines = dict(line.split("=", 1) for line in props.splitlines() if "=" in line)
    assert lines["listener.security.protocol.map"] == (
        "CONTROLLER:SSL,SASL_SSL:SASL_SSL,MTLS:SSL"
    )  # no PLAINTEXT listener at all
    assert lines["listener.name.mtls.ssl.client.auth"] == "required"
    assert lines["listener.name.controller.ssl.client.auth"] == "required"
    assert lines["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert lines["authorizer.class.name"].endswith("StandardAuthorizer")
    assert lines["super.users"] == "User:admin;User:broker"
    assert lines["allow.everyone.if.no.acl.found"] == "false"
    assert not any(broker.password(u) in props for u in USERS)


def test_broker_env_prints_the_clients_variables(
    broker: SecureBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert broker.cache_dir is not None
    monkeypatch.setenv("KBATCH_CACHE_DIR", str(broker.cache_dir))
    out = CliRunner().invoke(cli, ["broker", "env", "--port", "29093", "--user", "client"])
    assert out.exit_code == 0, out.output
    env = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1)
               for line in out.output.splitlines() if line.startswith("export "))  # fmt: skip
    assert env["KBATCH_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["KBATCH_SASL_USERNAME"] == "client"
    assert env["KBATCH_SASL_PASSWORD"] == broker.password("client")
    assert Path(env["KBATCH_SSL_CAFILE"]) == broker.tls_dir / "ca.pem"
    mtls = CliRunner().invoke(cli, ["broker", "env", "--port", "29093", "--mtls"])
    assert "KBATCH_SSL_CERTFILE" in mtls.output and "export KBATCH_SASL" not in mtls.output
    assert broker.password("kbatch") not in mtls.output
    assert "127.0.0.1:29095" in mtls.output
    none = CliRunner().invoke(cli, ["broker", "env", "--port", "1"])
    assert none.exit_code == 2 and "--secure --port 1" in none.output


def _eval_in_shell(lines: str, earlier: dict[str, str]) -> dict[str, str]:
    """The ``KBATCH_*`` variables a shell holding ``earlier`` has after ``eval "$lines"``."""
    script = 'eval "$EVAL_LINES" && env -0'
    env = {"PATH": "/usr/bin:/bin", "EVAL_LINES": lines, **earlier}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, check=True).stdout
    pairs = (item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k.startswith("KBATCH_")}


@pytest.mark.parametrize("mtls", [True, False], ids=["mtls-after-sasl", "sasl-after-mtls"])
def test_broker_env_unsets_what_the_other_mode_set(
    broker: SecureBroker, monkeypatch: pytest.MonkeyPatch, mtls: bool
) -> None:
    """Regression: `eval "$(kbatch broker env --mtls)"` after the SASL lines left
    KBATCH_SASL_* exported; the lines now leave exactly the chosen mode's variables."""
    assert broker.cache_dir is not None
    monkeypatch.setenv("KBATCH_CACHE_DIR", str(broker.cache_dir))
    args = ["broker", "env", "--port", "29093", "--user", "client"]
    first = CliRunner().invoke(cli, args + ([] if mtls else ["--mtls"]))
    second = CliRunner().invoke(cli, args + (["--mtls"] if mtls else []))
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    earlier = _eval_in_shell(first.output, {"KBATCH_SSL_CHECK_HOSTNAME": "false"})
    after = _eval_in_shell(second.output, earlier)
    expected = broker.client_env("client", mtls=mtls)
    assert after == expected
    KafkaClientSettings.model_validate(
        {k.removeprefix("KBATCH_").lower(): v for k, v in after.items()}
    )  # what a client reads from this shell is one valid mode
