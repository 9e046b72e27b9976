"""Keeps nats-server's accounts equal to the ledger's bus credentials and the services' own, and gives each
tenant's account its status stream.

The services, and the data folder's admin, get identities of this process: their passwords live in
memory (the admin's also in its 0600 file), and only bcrypt hashes reach the server's config.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.bus.connection import BUS_ERRORS, connect
from services.bus.streams import DirectGetError, last_messages
from shared.contract import bus_auth, subjects
from shared.ledger.bus_credentials import active_users, credential_tenants, hash_password, new_password, revision
from shared.ledger.engine import sessions
from shared.ledger.handles import AsyncEngine
from shared.settings import BusSettings

log = logging.getLogger("claimbroker.bus-auth")

ADMIN_PASSWORD_FILE = "bus-admin.password"
STREAM_NOT_FOUND = 10059
WRONG_LAST_SEQUENCE = 10071  # a backfilled status refused: the claim has a status there already
REQUEST_TIMEOUT_S = 5.0
BACKFILL_AT_ONCE = 256  # backfill publishes awaiting their acknowledgement together
PROVISION_RETRY_MAX_S = 60.0


@dataclass
class Identity:
    user: str
    password: str
    role: str

    def bus_user(self) -> bus_auth.BusUser:
        return bus_auth.BusUser(self.user, hash_password(self.password), self.role)


def admin_password(data_dir: Path) -> str:
    """The data folder's bus admin password, created once (like its admin token) and readable by its owner
    only: the CLI run in that folder uses it."""
    path = data_dir / ADMIN_PASSWORD_FILE
    if not path.exists():
        path.write_text(new_password())
        path.chmod(0o600)
    return path.read_text().strip()


@dataclass
class FileTarget:
    """An external nats-server's accounts (Kubernetes: the broker's sidecar beside each NATS server): the
    file its config includes, written whole, and a SIGHUP to the process in `pid_file` (the server's
    `pid_file`; the pod shares its process namespace) once the server runs. The server reloads on its own
    time and says nothing back: a write returns `settle` seconds after the signal, so that a new tenant's
    bare account (BusAuthority) is in every server of a cluster, each reloaded by its own sidecar within a
    poll, before its imports are."""

    path: Path
    pid_file: Path | None = None
    settle: float = 2.0

    def __call__(self, text: str) -> None:
        staged = self.path.with_name(self.path.name + ".new")
        staged.write_text(text)
        staged.chmod(0o600)
        staged.replace(self.path)
        if self.pid_file is not None and self.pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):  # not started yet, or gone: it reads the file
                os.kill(int(self.pid_file.read_text().strip()), signal.SIGHUP)
                time.sleep(self.settle)


class ProvisionError(RuntimeError):
    pass


@dataclass
class Provisioner:
    """Gives a tenant's account its `CLAIMBROKER_STATUS` stream, as the bus admin of the broker's account
    (`url`), through the stream API the tenant's account exports to it, and copies into it the tenant's
    last status of each claim from the broker's stream, so a credential created after a claim was decided
    still reads that claim. A copy is published with `Nats-Expected-Last-Subject-Sequence: 0`: it never
    replaces a status the stream caught live. Once copied, the stream's metadata says so, and a restart
    copies nothing again."""

    url: str
    limits: bus_auth.TenantLimits
    tls_ca: Path | None = None
    _nc: Client | None = None

    async def _client(self) -> Client:
        if self._nc is None or self._nc.is_closed:
            self._nc = await connect(self.url, name="claimbroker-bus-auth", tls_ca=self.tls_ca)
        return self._nc

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(*BUS_ERRORS):
                await self._nc.close()
            self._nc = None

    async def _api(self, tenant: str, operation: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        nc = await self._client()
        reply = await nc.request(bus_auth.provision_subject(tenant, operation),
                                 json.dumps(body).encode() if body is not None else b"", timeout=REQUEST_TIMEOUT_S)
        answer: dict[str, Any] = json.loads(reply.data)
        return answer

    async def provision(self, tenant: str) -> None:
        wanted = bus_auth.tenant_status_stream(tenant, self.limits)
        info = await self._api(tenant, "info")
        if info.get("error", {}).get("err_code") == STREAM_NOT_FOUND:
            info = await self._api(tenant, "create", wanted)
        elif "error" not in info and _differs(info["config"], wanted):
            info = await self._api(tenant, "update", {**info["config"], **wanted})
        if "error" in info:
            raise ProvisionError(f"tenant {tenant}'s status stream: {info['error'].get('description')}")
        config = info["config"]
        if bus_auth.BACKFILLED in (config.get("metadata") or {}):
            return
        copied = await self._backfill(tenant)
        metadata = {**(config.get("metadata") or {}), bus_auth.BACKFILLED: datetime.now(UTC).isoformat()}
        done = await self._api(tenant, "update", {**config, "metadata": metadata})
        if "error" in done:
            raise ProvisionError(f"tenant {tenant}'s status stream: {done['error'].get('description')}")
        log.info("tenant %s: status stream provisioned, %d statuses copied in", tenant, copied)

    async def _backfill(self, tenant: str) -> int:
        nc = await self._client()
        try:
            latest = await last_messages(nc, subjects.STATUS_STREAM, bus_auth.status_filter(tenant),
                                         timeout=REQUEST_TIMEOUT_S)
        except DirectGetError as error:
            raise ProvisionError(f"the broker's statuses of tenant {tenant} could not be read: {error}") from None
        copied = 0
        items = sorted(latest.items())
        for start in range(0, len(items), BACKFILL_AT_ONCE):
            batch = items[start:start + BACKFILL_AT_ONCE]
            replies = await asyncio.gather(*(
                nc.request(bus_auth.backfill_subject(tenant, subjects.status_parts(subject)[1]), message.data,
                           headers=_copy_headers(message), timeout=REQUEST_TIMEOUT_S)
                for subject, message in batch))
            for reply in replies:
                refused = json.loads(reply.data).get("error")
                if refused is None:
                    copied += 1
                elif refused.get("err_code") != WRONG_LAST_SEQUENCE:
                    raise ProvisionError(f"tenant {tenant}: a status not copied: {refused.get('description')}")
        return copied


def _copy_headers(message: Msg) -> dict[str, str]:
    """A copy is stored only where the claim has no status yet, and expires as the original does."""
    headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
    if message.headers and (ttl := message.headers.get("Nats-TTL")):
        headers["Nats-TTL"] = ttl
    return headers


def _differs(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return any(existing.get(key) != value for key, value in wanted.items() if key != "duplicate_window")


@dataclass
class BusAuthority:
    """`reload(text)` applies a rendered `accounts` block: the embedded server's reload, or a FileTarget.
    With a `provisioner`, each tenant account gets its status stream once the server knows the account."""

    engine: AsyncEngine
    own: list[bus_auth.BusUser]  # the services' and the admin's, hashed once
    reload: Callable[[str], None]
    poll_interval: float = 0.5
    limits: bus_auth.TenantLimits = field(default_factory=bus_auth.TenantLimits)
    provisioner: Provisioner | None = None
    applied: str | None = None
    tenants: list[str] = field(default_factory=list)  # the ledger's, at the last render
    served: set[str] = field(default_factory=set)  # tenants the server has an account of
    provisioned: set[str] = field(default_factory=set)
    _failures: dict[str, int] = field(default_factory=dict)
    _retry_at: dict[str, float] = field(default_factory=dict)
    _seen: tuple[int, int] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def render(self) -> str:
        """The accounts as the ledger has them now (the server starts with them whole)."""
        text, _ = await self._render()
        self.served = set(self.tenants)
        return text

    async def _render(self) -> tuple[str, str | None]:
        """The accounts as the ledger has them, and first, where it brings in tenants the server has no
        account of yet, the same with those accounts bare (bus_auth.render_accounts says why)."""
        async with sessions(self.engine)() as session:
            self._seen = await revision(session)
            users = [*self.own, *await active_users(session)]
            self.tenants = await credential_tenants(session)
        new = set(self.tenants) - self.served
        staged = bus_auth.render_accounts(users, self.tenants, self.limits, bare=new) if new else None
        return bus_auth.render_accounts(users, self.tenants, self.limits), staged

    async def apply(self) -> None:
        """Render from the ledger, reload the server and provision new tenant accounts; returns once the
        reload took effect (a provisioning that fails is tried again by `run`)."""
        async with self._lock:
            text, staged = await self._render()
            if text != self.applied:
                if staged is not None:
                    await asyncio.to_thread(self.reload, staged)
                    self.served = set(self.tenants)
                await asyncio.to_thread(self.reload, text)
                self.applied = text
                log.info("bus credentials reloaded")
            await self._provision()

    async def _provision(self) -> None:
        if self.provisioner is None:
            return
        now = asyncio.get_running_loop().time()
        for tenant in self.tenants:
            if tenant in self.provisioned or self._retry_at.get(tenant, 0.0) > now:
                continue
            try:
                await self.provisioner.provision(tenant)
            except (*BUS_ERRORS, ProvisionError, ValueError, KeyError) as error:  # not reloaded yet, NATS away
                failures = self._failures[tenant] = self._failures.get(tenant, 0) + 1
                self._retry_at[tenant] = now + min(PROVISION_RETRY_MAX_S, self.poll_interval * 2 ** failures)
                (log.warning if failures == 3 or failures % 10 == 0 else log.debug)(
                    "tenant %s's status stream not provisioned yet (%d tries): %r", tenant, failures, error)
                continue
            self.provisioned.add(tenant)
            self._failures.pop(tenant, None)
            self._retry_at.pop(tenant, None)

    async def run(self) -> None:
        """Follow the ledger: what another process (a CLI, a second API) changed applies within a poll; a
        tenant account not provisioned yet is tried again at each poll."""
        try:
            while True:
                try:
                    async with sessions(self.engine)() as session:
                        current = await revision(session)
                    if current != self._seen or set(self.tenants) - self.provisioned:
                        await self.apply()
                except Exception as error:  # the follow loop's guard: the ledger or the server away, users kept
                    log.warning("bus credentials not reloaded: %r", error)
                await asyncio.sleep(self.poll_interval)
        finally:
            if self.provisioner is not None:
                await self.provisioner.close()


def tenant_limits(settings: BusSettings) -> bus_auth.TenantLimits:
    return bus_auth.TenantLimits(connections=settings.tenant_connections, subscriptions=settings.tenant_subscriptions,
                                 consumers=settings.tenant_consumers, status_bytes=settings.tenant_status_bytes,
                                 replicas=settings.stream_replicas)


def own_identities(passwords: Mapping[str, str]) -> list[bus_auth.BusUser]:
    """The services' and the admin's users, from their passwords (named by service, and "admin")."""
    users = []
    for name, password in passwords.items():
        if name == "admin":
            users.append(Identity(bus_auth.admin_user(), password, "admin").bus_user())
        elif name in bus_auth.SERVICES:
            users.append(Identity(bus_auth.service_user(name), password, "service").bus_user())
        else:
            raise ValueError(f"a bus password for {name!r}: expected admin or one of {', '.join(bus_auth.SERVICES)}")
    return users
