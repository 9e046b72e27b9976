"""The contract's JetStream streams: their limits (every one lives here), created or brought to ours at a
service's start, and read without a consumer (the last message per subject, the fleet's inventories)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, Header, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from services.bus.connection import BUS_ERRORS, connect
from shared.contract import subjects
from shared.dra.inventory import Fleet

DUPLICATE_WINDOW_S = 600.0
# JetStream's duplicate window on the claims stream: its floor (0 means its 2-minute default). The window is
# one per stream, keyed on Nats-Msg-Id alone, so whatever it drops it drops across tenants and kinds: the
# ledger's inbox, per tenant and kind, is what makes a re-sent message change nothing (docs/reliability.md).
CLAIMS_DUPLICATE_WINDOW_S = 0.1
BACKLOG_FULL_CODE = 10077  # JetStream's answer to a publish past the claims stream's per-subject limit

STREAMS = (
    StreamConfig(
        name=subjects.INVENTORY_STREAM, subjects=[subjects.INVENTORY_ALL], storage=StorageType.FILE,
        max_msgs_per_subject=1, duplicate_window=DUPLICATE_WINDOW_S, allow_direct=True,
    ),
    # A work queue: a submission or release leaves once the allocator acked it (it committed to the ledger).
    # At most `tenant_backlog` wait per subject, that is per tenant and kind, and a publish past that is
    # refused (discard new, per subject): a tenant flooding the bus waits for its own backlog and cannot
    # bury the others' claims under its own.
    StreamConfig(
        name=subjects.CLAIMS_STREAM, subjects=[subjects.SUBMIT_ALL, subjects.RELEASE_ALL],
        storage=StorageType.FILE, retention=RetentionPolicy.WORK_QUEUE, duplicate_window=CLAIMS_DUPLICATE_WINDOW_S,
        max_msgs_per_subject=16, discard=DiscardPolicy.NEW, discard_new_per_subject=True,
    ),
    # Read by direct get (`last_messages`): a reader needs no consumer. Each tenant's account has a stream of
    # the same name holding its own statuses (shared/contract/bus_auth.py).
    StreamConfig(
        name=subjects.STATUS_STREAM, subjects=[subjects.STATUS_ALL], storage=StorageType.FILE,
        max_msgs_per_subject=16, duplicate_window=DUPLICATE_WINDOW_S, allow_direct=True,
        allow_msg_ttl=True,  # the answer to a release of an unknown claim expires (services/allocator/claim_batch.py)
    ),
    StreamConfig(
        name=subjects.ALERTS_STREAM, subjects=[subjects.ALERTS_ALL], storage=StorageType.FILE,
        max_msgs=100_000, discard=DiscardPolicy.OLD, duplicate_window=DUPLICATE_WINDOW_S,
    ),
)


log = logging.getLogger("claimbroker.nats")


async def ensure_streams(
    js: JetStreamContext, replicas: int | None = None, tenant_backlog: int | None = None
) -> None:
    """Create the contract's streams, or bring their config to ours (every limit lives here). `replicas`:
    how many servers of a NATS cluster keep each stream (3 survives the loss of one); `tenant_backlog`: the
    claims a tenant may have waiting on the bus. None keeps what an existing stream has (ours for a new one),
    so a service never undoes what the operator set."""
    for config in STREAMS:
        wanted = dataclasses.replace(config, num_replicas=replicas or 1)
        if config.name == subjects.CLAIMS_STREAM and tenant_backlog is not None:
            wanted.max_msgs_per_subject = tenant_backlog
        try:
            await js.add_stream(wanted)
        except BadRequestError:
            existing = (await js.stream_info(str(config.name))).config
            wanted.num_replicas = replicas or existing.num_replicas
            if config.name == subjects.CLAIMS_STREAM:
                wanted = _kept_claims_config(wanted, existing, tenant_backlog)
            await js.update_stream(wanted)


def _kept_claims_config(wanted: StreamConfig, existing: StreamConfig, tenant_backlog: int | None) -> StreamConfig:
    """The claims stream keeps the operator's backlog limit; one made by an older version (limits
    retention: JetStream cannot change a stream's retention) keeps working, without the limit, which
    there would cap the stream's history instead of its backlog. Its duplicate window is always ours (the
    floor: an older version's ten minutes let one tenant's ids shadow another's)."""
    if existing.retention != wanted.retention:
        log.warning("the claims stream keeps every message (made by an older claim-broker): no per-tenant "
                    "backlog limit until it is recreated (`nats stream rm %s` while the allocator is stopped and "
                    "the stream empty of waiting claims)", subjects.CLAIMS_STREAM)
        return dataclasses.replace(wanted, retention=existing.retention, max_msgs_per_subject=-1,
                                   discard=existing.discard, discard_new_per_subject=False)
    if tenant_backlog is None:
        return dataclasses.replace(wanted, max_msgs_per_subject=existing.max_msgs_per_subject)
    return wanted


async def read_fleet(url: str, tls_ca: Path | None = None, timeout: float = 30.0) -> Fleet:
    """Every node's last inventory message on the bus, read once (services/bus/fleet_view.py follows it)."""
    from services.bus.fleet_view import FleetView

    view = FleetView(lambda: connect(url, name="claimbroker-fleet-view", tls_ca=tls_ca))
    try:
        return await view.current(timeout, strict=True)
    finally:
        await view.close()


class DirectGetError(RuntimeError):
    """A direct get JetStream refused: `status` is its answer's (503: no such stream, or it has no direct
    get; 408: a request it cannot read)."""

    def __init__(self, stream: str, status: str, description: str) -> None:
        super().__init__(f"direct get on {stream}: {status} {description}".strip())
        self.status = status


DIRECT_PAGE = 1000  # messages a page of a stream read in order asks for


async def last_messages(nc: Client, stream: str, wanted: str, *, timeout: float = 5.0) -> dict[str, Msg]:
    """The last message of each subject matching `wanted` in `stream`, by JetStream's direct get (the stream
    has allow_direct): no consumer, so nothing a reader could exhaust or leave behind. One batch of
    `multi_last` answers up to 1,024 subjects; past that (413) the stream is read in order, a page at a
    time, each subject's later messages replacing its earlier ones."""
    latest: dict[str, Msg] = {}
    status, end = await _direct_batch(nc, stream, {"multi_last": [wanted]}, latest, timeout)
    if status == "413":  # more subjects than one batch answers: the stream in order
        sequence = 1
        while True:
            status, end = await _direct_batch(nc, stream, {"seq": sequence, "next_by_subj": wanted,
                                                           "batch": DIRECT_PAGE}, latest, timeout)
            if status != "204" or not int(end.get("Nats-Num-Pending", "0")):
                break
            sequence = int(end["Nats-Last-Sequence"]) + 1
    if status not in ("204", "404"):
        raise DirectGetError(stream, status, end.get("Description", ""))
    return latest


async def _direct_batch(nc: Client, stream: str, request: dict[str, Any], into: dict[str, Msg],
                        timeout: float) -> tuple[str, dict[str, str]]:
    """One batch of a direct get: its messages into `into` by subject; its closing status and headers (204
    once the batch is complete, 404 when nothing matched)."""
    inbox = nc.new_inbox()
    answers = await nc.subscribe(inbox)
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", orjson.dumps(request), reply=inbox)
        while True:
            message = await answers.next_msg(timeout)
            headers = message.headers or {}
            status = headers.get(Header.STATUS)
            if status:
                return status, {"Description": headers.get(Header.DESCRIPTION, ""), **{
                    k: v for k, v in headers.items() if isinstance(k, str) and k.startswith("Nats-")}}
            into[headers["Nats-Subject"]] = message
    finally:
        with contextlib.suppress(*BUS_ERRORS):
            await answers.unsubscribe()
