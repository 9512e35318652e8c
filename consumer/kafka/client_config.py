"""aiokafka keyword arguments from :class:`consumer.kafka.config.KafkaClientSettings`: the
security protocol, SASL (PLAIN, SCRAM, OAUTHBEARER from a token file) and a TLS context (CA,
client certificate and key for mutual TLS, host name checking on by default)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context

from consumer.kafka.aiokafka_errors import DENIALS, describe_denial, map_kafka_errors
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.errors import KafkaSecurityError, KafkaUnavailableError
from consumer.kafka.log_levels import quiet_retriable_errors


class TokenFileProvider(AbstractTokenProvider):  # type: ignore[misc]
    """OAUTHBEARER: the bearer token is the content of a file, read again at each login (a
    sidecar or the platform refreshes it; aiokafka calls :meth:`token` per connection)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    async def token(self) -> str:
        """The file's content, stripped.

        Raises:
            KafkaSecurityError: the file cannot be read or is empty.
        """
        try:
            token = self._path.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise KafkaSecurityError(
                f"cannot read the OAUTHBEARER token file {self._path}: {err.strerror}"
            ) from None
        if not token:
            raise KafkaSecurityError(f"the OAUTHBEARER token file {self._path} is empty")
        return token


def _readable(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise KafkaSecurityError(f"{what} {path} is not a readable file")
    return str(path)


def security_kwargs(settings: KafkaClientSettings) -> dict[str, Any]:
    """``security_protocol``, SASL and TLS settings as aiokafka client kwargs.

    Raises:
        KafkaSecurityError: a named file (CA, certificate, key, password, token) cannot be
            read, or the TLS files do not load (the message names the file, never a secret).
    """
    kwargs: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.security_protocol.startswith("SASL_") and settings.sasl_mechanism is not None:
        kwargs["sasl_mechanism"] = settings.sasl_mechanism
        if settings.sasl_mechanism == "OAUTHBEARER":
            assert settings.sasl_oauth_token_file is not None  # the settings' validator
            kwargs["sasl_oauth_token_provider"] = TokenFileProvider(settings.sasl_oauth_token_file)
        else:
            kwargs["sasl_plain_username"] = settings.sasl_username
            try:
                kwargs["sasl_plain_password"] = settings.password()
            except OSError as err:
                raise KafkaSecurityError(
                    f"cannot read the SASL password file {settings.sasl_password_file}: "
                    f"{err.strerror}"
                ) from None
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        cafile = _readable(settings.ssl_cafile, "the CA file")
        certfile = _readable(settings.ssl_certfile, "the client certificate")
        keyfile = _readable(settings.ssl_keyfile, "the client key")
        try:
            context = create_ssl_context(cafile=cafile, certfile=certfile, keyfile=keyfile)
        except ssl.SSLError as err:
            raise KafkaSecurityError(
                f"the TLS files do not load (CA {cafile}, certificate {certfile}, key "
                f"{keyfile}): {err.reason or err}"
            ) from None
        context.check_hostname = settings.ssl_check_hostname
        kwargs["ssl_context"] = context
    return kwargs


def client_kwargs(settings: KafkaClientSettings) -> dict[str, Any]:
    """``bootstrap_servers`` and :func:`security_kwargs`: what every aiokafka client takes."""
    return {"bootstrap_servers": settings.bootstrap, **security_kwargs(settings)}


class _ConnectFailures(logging.Filter):
    """Keeps (and hides) aiokafka's ``Unable connect to "host:port": <error>`` log lines while
    a client starts: aiokafka logs the cause (a TLS check, a SASL login) and raises only
    ``Unable to bootstrap``; the start-up error line names the cause instead. Its log lines
    about an ACL denial are hidden too: the raised error names the denial."""

    def __init__(self) -> None:
        super().__init__()
        self.causes: list[tuple[str, BaseException]] = []  # ("host:port", error)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            str(record.msg).startswith("Unable connect to")
            and isinstance(args, tuple)
            and len(args) == 3
            and isinstance(args[2], BaseException)
        ):
            self.causes.append((f"{args[0]}:{args[1]}", args[2]))
            return False
        # aiokafka's own line about an ACL denial (e.g. InitProducerId): the error says it
        return not (isinstance(args, tuple) and any(_is_denial(a) for a in args))


def _is_denial(value: object) -> bool:
    if isinstance(value, type):
        return issubclass(value, DENIALS)
    return isinstance(value, DENIALS)


def describe_connect_failure(cause: BaseException) -> tuple[bool, str]:
    """``(denied, text)`` for why a connection failed: denied when the broker answered but a
    TLS check or the SASL login failed (never retried); ``text`` names the cause, no secret."""
    if isinstance(cause, ssl.SSLCertVerificationError):
        reason = getattr(cause, "verify_message", None) or str(cause)
        return True, f"TLS check of the broker's certificate failed: {reason}"
    if isinstance(cause, ssl.SSLError):
        return True, f"TLS handshake failed: {getattr(cause, 'reason', None) or cause}"
    if isinstance(cause, DENIALS):
        return True, f"SASL login refused: {describe_denial(cause)}"
    return False, str(cause) or type(cause).__name__


FIRST_ANSWER_TIMEOUT_S = 15.0
"""How long an admin client's start waits for the bootstrap's first answer. A Kafka broker
answers its first request in milliseconds even when loaded; a port that accepts connections and
never speaks Kafka (another service, a black-holing proxy) would otherwise cost aiokafka's
``request_timeout_ms`` (40 s) before the one error line."""


async def start_client(
    start: Callable[[], Awaitable[object]],
    close: Callable[[], Awaitable[object]],
    context: str,
    timeout_s: float | None = None,
) -> None:
    """Start an aiokafka client (``start``); when no broker answers (within ``timeout_s``
    when given) or the broker refuses the client, ``close`` it and raise.

    Raises:
        KafkaSecurityError: a TLS check or the SASL login failed (``the broker at host:port
            refused the client: <cause>``, the cause aiokafka logged, without its log line), or
            an ACL denial.
        KafkaUnavailableError: ``f"{context}: {aiokafka's error}"``.
    """
    quiet_retriable_errors()  # a retried error is a WARNING a minute, not an ERROR each time
    failures = _ConnectFailures()
    aiokafka_log = logging.getLogger("aiokafka")  # aiokafka.client logs through it
    # First: it must see every connect failure, also one the quieting filter would drop.
    aiokafka_log.filters.insert(0, failures)
    try:
        await asyncio.wait_for(_mapped(start, context), timeout_s)
    except TimeoutError as err:  # wait_for's: the connection is open, nothing answered
        await close()
        raise KafkaUnavailableError(
            f"{context}: no answer within {timeout_s:g} s on an open connection (is it a "
            "Kafka listener, and does --security-protocol match it?)"
        ) from err
    except KafkaUnavailableError as err:
        await close()
        if isinstance(err, KafkaSecurityError) or not failures.causes:
            raise
        address, cause = failures.causes[-1]
        denied, text = describe_connect_failure(cause)
        if denied:
            raise KafkaSecurityError(f"the broker at {address} refused the client: {text}") from err
        raise KafkaUnavailableError(f"{context}: {text}") from err
    finally:
        aiokafka_log.removeFilter(failures)


async def _mapped(start: Callable[[], Awaitable[object]], context: str) -> None:
    """``start()`` with aiokafka's errors (its own timeouts too) as kbatch's."""
    with map_kafka_errors(KafkaUnavailableError, context):
        await start()
