"""Client security settings (consumer/kafka/config.py, client_config.py): validation, the
password from the environment or a file only, the TLS context, the OAUTHBEARER token file, and
how a failed connection is named. No broker."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import click
import pytest
from aiokafka.errors import SaslAuthenticationFailed, TopicAuthorizationFailedError
from pydantic import SecretStr, ValidationError

from consumer.cli.client_security import client_settings
from consumer.cli.load import load_command
from consumer.cli.request import request_command
from consumer.cli.topics import create as topics_create
from consumer.kafka.client_config import (
    TokenFileProvider,
    describe_connect_failure,
    security_kwargs,
    start_client,
)
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.errors import KafkaSecurityError, KafkaUnavailableError


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs a sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "needs sasl_username"),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "u",
            },
            "needs a password",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
            "needs sasl_oauth_token_file",
        ),
        ({"security_protocol": "SSL", "ssl_certfile": "c.pem"}, "both ssl_certfile and"),
    ],
)
def test_combinations_that_cannot_work_are_refused(fields: dict[str, str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        KafkaClientSettings.model_validate(fields)


def test_the_password_comes_from_a_file_and_never_prints(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    settings = KafkaClientSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="kbatch",
        sasl_password_file=secret,
    )
    kwargs = security_kwargs(settings)
    assert kwargs["sasl_plain_password"] == "s3cret"  # the newline cut
    with_env = settings.model_copy(update={"sasl_password": SecretStr("other")})
    assert security_kwargs(with_env)["sasl_plain_password"] == "other"  # the value wins
    assert "other" not in repr(with_env) and "other" not in str(with_env.model_dump(mode="json"))


def test_an_unreadable_file_is_a_security_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(KafkaSecurityError, match=r"nope\.pem"):
        security_kwargs(KafkaClientSettings(security_protocol="SSL", ssl_cafile=missing))
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(KafkaSecurityError, match="TLS files do not load"):
        security_kwargs(KafkaClientSettings(security_protocol="SSL", ssl_cafile=bad))


@pytest.mark.parametrize("check", [True, False])
def test_host_name_checking_is_on_unless_turned_off(check: bool) -> None:
    settings = KafkaClientSettings(security_protocol="SSL", ssl_check_hostname=check)
    context = security_kwargs(settings)["ssl_context"]
    assert context.check_hostname is check and context.verify_mode == ssl.CERT_REQUIRED
    assert KafkaClientSettings().ssl_check_hostname is True


async def test_the_oauth_token_is_read_from_its_file_at_each_login(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    settings = KafkaClientSettings(
        security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", sasl_oauth_token_file=token
    )
    provider = security_kwargs(settings)["sasl_oauth_token_provider"]
    assert isinstance(provider, TokenFileProvider)
    assert await provider.token() == "first"
    token.write_text("refreshed")
    assert await provider.token() == "refreshed"
    token.write_text("")
    with pytest.raises(KafkaSecurityError, match="empty"):
        await provider.token()


@pytest.mark.parametrize(
    ("cause", "denied", "text"),
    [
        (SaslAuthenticationFailed("invalid credentials"), True, "SASL login refused"),
        (ssl.SSLCertVerificationError(1, "x"), True, "TLS check"),
        (ConnectionRefusedError(111, "refused"), False, "refused"),
    ],
)
def test_a_connect_failure_is_named_by_its_cause(
    cause: BaseException, denied: bool, text: str
) -> None:
    assert describe_connect_failure(cause)[0] is denied
    assert text in describe_connect_failure(cause)[1]


async def test_start_client_reports_the_cause_aiokafka_only_logged() -> None:
    closed: list[bool] = []

    async def start() -> None:  # as aiokafka's bootstrap: log the cause, raise a vague error
        from aiokafka.errors import KafkaConnectionError

        err = SaslAuthenticationFailed("invalid credentials with SASL mechanism SCRAM")
        logging.getLogger("aiokafka").error('Unable connect to "%s:%s": %s', "h", 1, err)
        raise KafkaConnectionError("Unable to bootstrap from [h:1]")

    async def close() -> None:
        closed.append(True)

    with pytest.raises(KafkaSecurityError, match=r"the broker at h:1 refused .* SASL") as info:
        await start_client(start, close, "the producer")
    assert isinstance(info.value, KafkaUnavailableError) and not info.value.retriable
    assert closed == [True]


async def test_a_listener_that_never_answers_fails_within_the_bound() -> None:
    """A port that accepts and never speaks Kafka: one error within ``timeout_s`` (the admin
    client's first contact passes FIRST_ANSWER_TIMEOUT_S), not aiokafka's 40 s."""
    closed: list[bool] = []

    async def start() -> None:
        await asyncio.Event().wait()  # connected; no answer ever comes

    async def close() -> None:
        closed.append(True)

    with pytest.raises(KafkaUnavailableError, match=r"ctx: no answer within 0\.05 s") as info:
        await start_client(start, close, "ctx", timeout_s=0.05)
    assert "is it a Kafka listener" in str(info.value)
    assert closed == [True]


async def test_an_acl_denial_while_starting_is_a_security_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aiokafka.errors import ClusterAuthorizationFailedError

    async def start() -> None:  # as aiokafka's sender: its own error line, then the error
        logging.getLogger("aiokafka").error(
            "Unexpected error during InitProducerIdRequest: %s", ClusterAuthorizationFailedError
        )
        raise TopicAuthorizationFailedError("kbatch.requests")

    async def close() -> None:
        return None

    with pytest.raises(KafkaSecurityError, match=r"TOPIC_AUTHORIZATION_FAILED.*kbatch\.requests"):
        await start_client(start, close, "the consumer")
    assert "InitProducerId" not in caplog.text  # one error line: the raised one


@pytest.mark.parametrize("command", [request_command, load_command, topics_create])
def test_client_commands_take_the_security_flags_but_never_a_password(
    command: click.Command,
) -> None:
    flags = {o for p in command.params if isinstance(p, click.Option) for o in p.opts}
    assert {"--security-protocol", "--sasl-username", "--ssl-cafile", "--ssl-certfile"} <= flags
    assert {"--sasl-password-file", "--ssl-check-hostname"} <= flags
    assert not any(f == "--sasl-password" or "plain-password" in f for f in flags)


def test_client_settings_take_the_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KBATCH_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("KBATCH_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KBATCH_SASL_USERNAME", "client")
    monkeypatch.setenv("KBATCH_SASL_PASSWORD", "pw")
    settings = client_settings("b:1", {"sasl_username": "flagged", "ssl_cafile": None})
    assert settings.bootstrap == "b:1" and settings.sasl_username == "flagged"  # flag wins
    assert settings.password() == "pw"
    monkeypatch.setenv("KBATCH_SECURITY_PROTOCOL", "SASL_SSLX")
    with pytest.raises(click.UsageError, match=r"^KBATCH_SECURITY_PROTOCOL=SASL_SSLX: Input"):
        client_settings("b:1", {})


def test_a_password_flag_is_refused_by_the_cli() -> None:
    from click.testing import CliRunner

    from consumer.cli.serve import serve_command

    out = CliRunner().invoke(serve_command, ["--sasl-password", "x"])
    assert out.exit_code == 2 and "No such option" in out.output
