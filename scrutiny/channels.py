"""The one way scrutiny opens a gRPC channel (to an agent, to an auditor, to etcd), threaded or on asyncio:
over TLS when it has credentials (`scrutiny.tls.channel_credentials`), in clear otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from grpc import aio

Options = Sequence[tuple[str, Any]]


def channel(address: str, credentials: grpc.ChannelCredentials | None = None, options: Options = ()) -> grpc.Channel:
    if credentials is not None:
        return grpc.secure_channel(address, credentials, list(options))
    return grpc.insecure_channel(address, list(options))


def aio_channel(address: str, credentials: grpc.ChannelCredentials | None = None,
                options: Options = ()) -> aio.Channel:
    if credentials is not None:
        return aio.secure_channel(address, credentials, list(options))
    return aio.insecure_channel(address, list(options))
