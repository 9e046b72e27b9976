"""Keeps the embedded nats-server's users equal to the ledger's bus credentials and the services' own.

The services, and the data folder's admin, get identities of this process: their passwords live in
memory (the admin's also in its 0600 file), and only bcrypt hashes reach the server's config.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from shared.contract import bus_auth
from shared.ledger.bus_credentials import active_users, hash_password, new_password, revision
from shared.ledger.engine import sessions

log = logging.getLogger("claimbroker.bus-auth")

ADMIN_PASSWORD_FILE = "bus-admin.password"


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
    """An external nats-server's users (Kubernetes: the broker's sidecar beside each NATS server): the file
    its config includes, written whole, and a SIGHUP to the process in `pid_file` (the server's
    `pid_file`; the pod shares its process namespace) once the server runs."""

    path: Path
    pid_file: Path | None = None

    def __call__(self, text: str) -> None:
        staged = self.path.with_name(self.path.name + ".new")
        staged.write_text(text)
        staged.chmod(0o600)
        staged.replace(self.path)
        if self.pid_file is not None and self.pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):  # not started yet, or gone: it reads the file
                os.kill(int(self.pid_file.read_text().strip()), signal.SIGHUP)


@dataclass
class BusAuthority:
    """`reload(text)` applies a rendered `authorization` block: the embedded server's reload, or a FileTarget."""

    engine: AsyncEngine
    own: list[bus_auth.BusUser]  # the services' and the admin's, hashed once
    reload: Callable[[str], None]
    poll_interval: float = 0.5
    applied: str | None = None
    _seen: tuple[int, int] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def render(self) -> str:
        async with sessions(self.engine)() as session:
            self._seen = await revision(session)
            users = await active_users(session)
        return bus_auth.render_authorization([*self.own, *users])

    async def apply(self) -> None:
        """Render from the ledger and reload the server; returns once it took effect."""
        async with self._lock:
            text = await self.render()
            if text != self.applied:
                await asyncio.to_thread(self.reload, text)
                self.applied = text
                log.info("bus credentials reloaded")

    async def run(self) -> None:
        """Follow the ledger: what another process (a CLI, a second API) changed applies within a poll."""
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                async with sessions(self.engine)() as session:
                    current = await revision(session)
                if current != self._seen:
                    await self.apply()
            except Exception as error:  # the ledger or the server away for a while: the users stay as they were
                log.warning("bus credentials not reloaded: %r", error)


def own_identities(passwords: dict[str, str]) -> list[bus_auth.BusUser]:
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
