"""The AsyncAPI document of the broker's subjects and payloads, as FastStream generates it from the
declarations below: the subjects of `shared.subjects`, the payload models of `shared.messages`. Each
service's channels are a FastStream router of their own (what it receives, what it sends), composed on one
broker that is never connected: the document describes the bus, it does not consume from it.

`claimbroker asyncapi` prints it, the admin API serves it at /asyncapi.json, and a test checks it against
the contract's subject table. A tenant can write a client from it alone."""

from __future__ import annotations

import json
from typing import Any

from faststream import FastStream
from faststream.nats import JStream, NatsBroker, NatsRouter
from faststream.specification import AsyncAPI

from shared import messages, subjects

VERSION = "1.0.0"  # of the message contract (subjects prefix claimbroker.v1)
_P = subjects.PREFIX
_IDS = ("Publish it with a Nats-Msg-Id header: a resend with the same id within the stream's duplicate "
        "window changes nothing.")


def _stream(name: str) -> JStream:
    return JStream(name=name, declare=False)  # the services create the streams (services.natsio); never here


def _allocator() -> NatsRouter:
    router = NatsRouter()
    claims = _stream(subjects.CLAIMS_STREAM)

    @router.subscriber(f"{_P}.claims.submit.{{tenant}}", stream=claims, title="claims.submit",
                       description="A tenant submits a ResourceClaim. Its metadata.namespace must equal "
                                   "{tenant} or be empty. " + _IDS)
    async def submit(claim: messages.ResourceClaim) -> None:
        """The allocator decides it (its own pull loop: see services/allocator/service.py)."""

    @router.subscriber(f"{_P}.claims.release.{{tenant}}", stream=claims, title="claims.release",
                       description="A tenant releases one of its claims (allocated or waiting). " + _IDS)
    async def release(request: messages.Release) -> None:
        """The allocator gives the devices back and the claim ends Released."""

    router.publisher(f"{_P}.claims.status.{{tenant}}.{{claim}}", stream=_stream(subjects.STATUS_STREAM),
                     schema=messages.ClaimStatus, title="claims.status",
                     description="The allocator's decision on a claim: Pending, Allocated, Rejected, Preempted "
                                 "or Released, with the reason and, when Allocated, the devices. A tenant "
                                 "reads its own claims on claimbroker.v1.claims.status.{tenant}.>.")
    return router


def _watcher() -> NatsRouter:
    router = NatsRouter()
    router.publisher(f"{_P}.inventory.{{node}}", stream=_stream(subjects.INVENTORY_STREAM),
                     schema=messages.NodeInventory, title="inventory",
                     description="A node's full inventory (its ResourceSlices' devices, telemetry), republished "
                                 "at least every heartbeat interval; removed: true when the node goes. The "
                                 "stream keeps the last message per node: a new subscriber reads the fleet.")
    return router


def _notifier() -> NatsRouter:
    router = NatsRouter()
    router.publisher(f"{_P}.alerts.{{severity}}.{{kind}}", stream=_stream(subjects.ALERTS_STREAM),
                     schema=messages.Alert, title="alerts",
                     description="Actionable alerts: repeats of a key inside the fold window are counted, "
                                 "not published, and a message with resolved: true follows when the "
                                 "condition ends. Subscribe to claimbroker.v1.alerts.> or one severity.")
    return router


def application() -> FastStream:
    broker = NatsBroker("nats://127.0.0.1:4222", description="claim-broker's NATS JetStream (the URL `claimbroker "
                        "up` prints)", specification_url="nats://127.0.0.1:4222")
    for router in (_allocator(), _watcher(), _notifier()):
        broker.include_router(router)
    return FastStream(broker, specification=AsyncAPI(
        title="claim-broker", version=VERSION,
        description="GPU claims in (Kubernetes resource.k8s.io/v1 ResourceClaims), allocations, reasons and "
                    "alerts out, over NATS JetStream. Subjects carry the tenant and claim names as tokens."))


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document as JSON-ready data."""
    specification = application().schema.to_specification()  # type: ignore[union-attr]
    return json.loads(specification.to_json())  # type: ignore[no-any-return]
