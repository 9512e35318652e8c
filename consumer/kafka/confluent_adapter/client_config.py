"""librdkafka configuration from :class:`consumer.kafka.config.KafkaClientSettings`:
``bootstrap.servers``, the security protocol, SASL (PLAIN, SCRAM; OAUTHBEARER from a token
file, refreshed by :func:`oauth_token_refresh`) and TLS (CA, client certificate and key for
mutual TLS, host name checking on by default).

The property names are librdkafka's (its CONFIGURATION.md); the values are strings, as the
C library takes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.errors import KafkaSecurityError

OAUTH_TOKEN_LIFETIME_S = 300.0
"""How long a token read from ``sasl_oauth_token_file`` is taken to be valid: librdkafka asks
for a new one (calls :func:`oauth_token_refresh`'s callback) at 80 % of it, so a file that a
sidecar refreshes is read again every 4 minutes."""


def _readable(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise KafkaSecurityError(f"{what} {path} is not a readable file")
    return str(path)


def oauth_token_refresh(path: Path) -> Callable[[str], tuple[str, float]]:
    """librdkafka's ``oauth_cb``: the bearer token is the content of ``path`` (stripped), valid
    for :data:`OAUTH_TOKEN_LIFETIME_S` from now (seconds since the epoch).

    Raises (from the callback):
        KafkaSecurityError: the file cannot be read or is empty.
    """

    def refresh(_config: str) -> tuple[str, float]:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise KafkaSecurityError(
                f"cannot read the OAUTHBEARER token file {path}: {err.strerror}"
            ) from None
        if not token:
            raise KafkaSecurityError(f"the OAUTHBEARER token file {path} is empty")
        return token, time.time() + OAUTH_TOKEN_LIFETIME_S

    return refresh


def security_config(settings: KafkaClientSettings) -> dict[str, object]:
    """``security.protocol``, SASL and TLS properties (and ``oauth_cb`` for OAUTHBEARER).

    Raises:
        KafkaSecurityError: a named file (CA, certificate, key, password, token) cannot be
            read (the message names the file, never a secret).
    """
    config: dict[str, object] = {"security.protocol": settings.security_protocol.lower()}
    if settings.security_protocol.startswith("SASL_") and settings.sasl_mechanism is not None:
        config["sasl.mechanism"] = settings.sasl_mechanism
        if settings.sasl_mechanism == "OAUTHBEARER":
            assert settings.sasl_oauth_token_file is not None  # the settings' validator
            _readable(settings.sasl_oauth_token_file, "the OAUTHBEARER token file")
            config["oauth_cb"] = oauth_token_refresh(settings.sasl_oauth_token_file)
        else:
            config["sasl.username"] = settings.sasl_username or ""
            try:
                config["sasl.password"] = settings.password() or ""
            except OSError as err:
                raise KafkaSecurityError(
                    f"cannot read the SASL password file {settings.sasl_password_file}: "
                    f"{err.strerror}"
                ) from None
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        cafile = _readable(settings.ssl_cafile, "the CA file")
        certfile = _readable(settings.ssl_certfile, "the client certificate")
        keyfile = _readable(settings.ssl_keyfile, "the client key")
        if cafile is not None:
            config["ssl.ca.location"] = cafile
        if certfile is not None and keyfile is not None:
            config["ssl.certificate.location"] = certfile
            config["ssl.key.location"] = keyfile
        config["ssl.endpoint.identification.algorithm"] = (
            "https" if settings.ssl_check_hostname else "none"
        )
    return config


def client_config(settings: KafkaClientSettings) -> dict[str, object]:
    """``bootstrap.servers`` and :func:`security_config`: what every librdkafka client takes.

    Raises:
        KafkaSecurityError: as :func:`security_config`.
    """
    return {"bootstrap.servers": settings.bootstrap, **security_config(settings)}
