"""The AsyncAPI document of the broker's subjects and payloads, as FastStream generates it from the
services' routers (services/bus/channels.py, the ones the running apps include), composed on one broker
that is never connected: the document describes the bus, it does not consume from it.

`claimbroker asyncapi` prints it, the admin API serves it at /asyncapi.json, and a test checks it against
the contract's subject table. A tenant can write a client from it alone."""

from __future__ import annotations

import json
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker
from faststream.specification import AsyncAPI

from services.bus import channels

VERSION = "1.0.0"  # of the message contract (subjects prefix claimbroker.v1)


def application() -> FastStream:
    broker = NatsBroker("nats://127.0.0.1:4222", description="claim-broker's NATS JetStream (the URL `claimbroker "
                        "up` prints)", specification_url="nats://127.0.0.1:4222")
    for router in (channels.claims_channels(), channels.allocator_router(), channels.watcher_router(),
                   channels.notifier_router()):
        broker.include_router(router)
    return FastStream(broker, specification=AsyncAPI(
        title="claim-broker", version=VERSION,
        description="GPU claims in (Kubernetes resource.k8s.io/v1 ResourceClaims), allocations, reasons and "
                    "alerts out, over NATS JetStream. Subjects carry the tenant and claim names as tokens."))


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document as JSON-ready data."""
    specification = application().schema.to_specification()  # type: ignore[union-attr]
    return json.loads(specification.to_json())  # type: ignore[no-any-return]
