"""TLS for every gRPC server and client, optionally mutual; secrets read from files and redacted from logs.

Files are read once, at start; their contents (keys, passwords, tokens) are never logged or put into
a report: errors name the file, never what is in it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from scrutiny.errors import ConfigError


def read_secret(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if not data.strip():
        raise ConfigError(f"{what}: {path} is empty")
    return data


def read_credentials(path: str, what: str) -> tuple[str, str]:
    """(user, password) from a file holding `user:password`, the password never logged from here on."""
    text = read_secret(path, what).decode("utf-8").strip()
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ConfigError(f"{what} in {path} are not of the form user:password")
    redact(text, password)
    return user, password


def server_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials | None:
    """None without a certificate (plaintext). With `client_ca`, clients must present a certificate
    signed by it (mutual TLS)."""
    if not cert and not key:
        if client_ca:
            raise ConfigError("a client CA (mutual TLS) needs the server's own certificate and key too")
        return None
    if not (cert and key):
        raise ConfigError("TLS needs both a certificate and its key")
    pair = [(read_secret(key, "TLS key"), read_secret(cert, "TLS certificate"))]
    if client_ca:
        return grpc.ssl_server_credentials(pair, root_certificates=read_secret(client_ca, "TLS client CA"),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials(pair)


def channel_credentials(ca: str = "", cert: str = "", key: str = "") -> grpc.ChannelCredentials | None:
    """None when nothing is configured (plaintext). `ca` verifies the server; `cert`/`key` are this
    client's own certificate for mutual TLS."""
    if not (ca or cert or key):
        return None
    if bool(cert) != bool(key):
        raise ConfigError("a client certificate needs its key (and the key its certificate)")
    return grpc.ssl_channel_credentials(
        root_certificates=read_secret(ca, "TLS CA") if ca else None,
        private_key=read_secret(key, "TLS client key") if key else None,
        certificate_chain=read_secret(cert, "TLS client certificate") if cert else None,
    )


def verified_peer(context: grpc.ServicerContext) -> bool:
    """True when the caller presented a certificate that the server's client CA verified."""
    auth = context.auth_context()
    return bool(auth.get("x509_common_name") or auth.get("x509_subject_alternative_name"))


class _Redact(logging.Filter):
    """kazoo logs its Auth request, credentials included, at DEBUG: never let a secret through."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(s in message for s in self.secrets):
            for s in self.secrets:
                message = message.replace(s, "***")
            record.msg, record.args = message, ()
        return True


_REDACT = _Redact()
for _name in ("kazoo", "kazoo.client", "kazoo.protocol.connection"):
    logging.getLogger(_name).addFilter(_REDACT)


def redact(*secrets: str) -> None:
    """Never log these strings (kazoo logs its Auth packet at DEBUG)."""
    _REDACT.secrets.update(secrets)
