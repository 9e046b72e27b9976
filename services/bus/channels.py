"""The broker's channels as FastStream routers, one per service: what it receives and what it sends, with
the payload models of `shared.contract.messages`. The running apps (`services/<name>/app.py`) include them with their
handlers; `services/bus/asyncapi.py` includes them with none, so the AsyncAPI document describes the code that
runs. Channels a service serves on its nats-py connection (services/runtime/service_app.py says why) are declared here
too, in `claims_channels`, and only the document includes them: declared on a running broker, FastStream
would consume them a second time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream.nats import JStream, NatsRouter
from nats.js.api import DeliverPolicy

from shared.contract import messages, subjects

_P = subjects.PREFIX
_IDS = ("Publish it with a Nats-Msg-Id header: a resend with the same id within the stream's duplicate "
        "window changes nothing.")
OnInventory = Callable[[messages.NodeInventory], Awaitable[None]]


def _stream(name: str) -> JStream:
    return JStream(name=name, declare=False)  # services.bus.streams.ensure_streams creates them, with their limits


def _inventory_subscriber(router: NatsRouter, service: str, on_inventory: OnInventory) -> None:
    @router.subscriber(f"{_P}.inventory.{{node}}", stream=_stream(subjects.INVENTORY_STREAM), ordered_consumer=True,
                       deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, title=f"{service}.inventory",
                       description=f"The {service} reads the fleet: at start the last inventory of every node, "
                                   "then each change.")
    async def inventory(node: messages.NodeInventory) -> None:
        await on_inventory(node)


async def _ignore(_: messages.NodeInventory) -> None:
    """The document's stand-in for a running service's handler."""


def allocator_router(on_inventory: OnInventory = _ignore) -> NatsRouter:
    router = NatsRouter()
    _inventory_subscriber(router, "allocator", on_inventory)
    router.publisher(f"{_P}.claims.status.{{tenant}}.{{claim}}", stream=_stream(subjects.STATUS_STREAM),
                     schema=messages.ClaimStatusSchema, title="claims.status",
                     description="The allocator's decision on a claim: Pending, Allocated, Rejected, Preempted "
                                 "or Released, with the reason and, when Allocated, the devices. {claim} is "
                                 "the claim's name with each '.' written '_' (train.v2: train_v2); the payload "
                                 "keeps the name. A tenant reads its own claims on "
                                 "claimbroker.v1.claims.status.{tenant}.>.")
    return router


def claims_channels() -> NatsRouter:
    """What tenants send the allocator, which consumes it in batches on its nats-py connection."""
    router = NatsRouter()
    claims = _stream(subjects.CLAIMS_STREAM)

    @router.subscriber(f"{_P}.claims.submit.{{tenant}}", stream=claims, title="claims.submit",
                       description="A tenant submits a ResourceClaim. Its metadata.namespace must equal "
                                   "{tenant} or be empty. " + _IDS)
    async def submit(claim: messages.ResourceClaim) -> None:
        """The allocator decides it."""

    @router.subscriber(f"{_P}.claims.release.{{tenant}}", stream=claims, title="claims.release",
                       description="A tenant releases one of its claims (allocated or waiting). " + _IDS)
    async def release(request: messages.Release) -> None:
        """The allocator gives the devices back and the claim ends Released."""

    return router


def watcher_router() -> NatsRouter:
    router = NatsRouter()
    router.publisher(f"{_P}.inventory.{{node}}", stream=_stream(subjects.INVENTORY_STREAM),
                     schema=messages.NodeInventory, title="inventory",
                     description="A node's full inventory (its ResourceSlices' devices, telemetry), on {node}: "
                                 "its name with each '.' written '_' (gpu-1.example.com: gpu-1_example_com). "
                                 "Republished at least every heartbeat interval; removed: true when the node goes. The "
                                 "stream keeps the last message per node: a new subscriber reads the fleet.")
    return router


def notifier_router(on_inventory: OnInventory = _ignore) -> NatsRouter:
    router = NatsRouter()
    _inventory_subscriber(router, "notifier", on_inventory)
    router.publisher(f"{_P}.alerts.{{severity}}.{{kind}}.{{tenant}}", stream=_stream(subjects.ALERTS_STREAM),
                     schema=messages.Alert, title="alerts",
                     description="Actionable alerts: repeats of a key inside the fold window are counted, "
                                 "not published, and a message with resolved: true follows when the "
                                 "condition ends. {tenant} is _fleet for alerts about no tenant. Subscribe "
                                 "to claimbroker.v1.alerts.>, one severity, or one tenant's "
                                 "(claimbroker.v1.alerts.*.*.{tenant}).")
    return router
