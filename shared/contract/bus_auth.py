"""Who may do what on the NATS bus: each identity's permissions, and the server's `authorization` block.

The mechanism is nats-server's own users with bcrypt-hashed passwords, in a file the broker renders from
the ledger and the server re-reads on a config reload (SIGHUP), rather than an auth callout service:
- the server keeps authenticating when the broker is down (a callout makes every connection wait on the
  broker, and a broker that cannot start cannot be let in to fix itself);
- a reload re-checks every live connection, so a revoked credential loses its connection at once, where a
  callout only decides new connections (a kick needs the system account);
- nothing secret is written: the file holds bcrypt hashes, which the server checks itself.
The cost: a NATS cluster needs the file on each server (docs/operations.md, Bus credentials).

Every identity gets its own inbox prefix (`_I.<user>`), so its request replies and consumer deliveries
are subjects only it may read. Names are dotted subject tokens: `tenant.<tenant>.<id>`, `alerts.<id>`,
`service.<name>`, `admin.<name>`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from shared.contract import subjects

INBOX = "_I"
ROLES = ("tenant", "alerts")
SERVICES = ("allocator", "notifier", "watcher")
# durable consumers of the services on the status stream: a tenant may name its own consumers there, never these
SERVICE_CONSUMERS = ("notifier",)

_CREATE = "$JS.API.CONSUMER.CREATE"
_SERVICE_JS = ["$JS.API.>", "$JS.ACK.>", "$JS.FC.>"]
_SERVICE_SUBJECTS = {
    "allocator": [subjects.STATUS_ALL, subjects.ALERTS_ALL],
    "notifier": [subjects.ALERTS_ALL],
    "watcher": [subjects.INVENTORY_ALL, subjects.ALERTS_ALL],
}


def inbox_prefix(user: str) -> str:
    """The only prefix under which `user` may receive replies and deliveries."""
    return f"{INBOX}.{user}"


def tenant_user(tenant: str, key: str) -> str:
    return f"tenant.{subjects.token(tenant)}.{subjects.token(key)}"


def alerts_user(key: str) -> str:
    return f"alerts.{subjects.token(key)}"


def service_user(service: str) -> str:
    return f"service.{subjects.token(service)}"


def admin_user(name: str = "local") -> str:
    return f"admin.{subjects.token(name)}"


def tenant_of_user(user: str) -> str | None:
    """The tenant a tenant credential's user name belongs to, else None."""
    parts = user.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "tenant" else None


def status_filter(tenant: str, claim: str = ">") -> str:
    return f"{subjects.PREFIX}.claims.status.{tenant}.{claim}"


def consumer_create_subject(stream: str, consumer: str, filter_subject: str) -> str:
    """The JetStream API subject that creates `consumer` on `stream` filtered to `filter_subject`: the server
    refuses a request whose configured filter differs from the one in the subject, so a permission on this
    subject is a permission on what the consumer may read."""
    return f"{_CREATE}.{stream}.{consumer}.{filter_subject}"


def permissions(role: str, user: str, tenant: str | None = None) -> dict[str, Any]:
    """The permissions of an identity, in nats-server's form."""
    own_inbox = f"{inbox_prefix(user)}.>"
    if role == "tenant":
        if tenant is None:
            raise ValueError("a tenant credential names its tenant")
        return {
            "publish": {
                "allow": [subjects.submit(tenant), subjects.release(tenant),
                          consumer_create_subject(subjects.STATUS_STREAM, "*", status_filter(tenant))],
                "deny": [consumer_create_subject(subjects.STATUS_STREAM, name, ">") for name in SERVICE_CONSUMERS],
            },
            "subscribe": {"allow": [own_inbox]},
        }
    if role == "alerts":
        return {"publish": {"deny": [">"]}, "subscribe": {"allow": [subjects.ALERTS_ALL, own_inbox]}}
    if role == "service":
        service = user.removeprefix("service.")
        return {"publish": {"allow": [*_SERVICE_SUBJECTS[service], *_SERVICE_JS]},
                "subscribe": {"allow": [own_inbox]}}
    if role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    raise ValueError(f"unknown bus role {role!r}")


@dataclass(frozen=True)
class BusUser:
    user: str
    password_hash: str  # bcrypt: nats-server checks it itself
    role: str
    tenant: str | None = None


def render_authorization(users: Iterable[BusUser]) -> str:
    """nats-server's `authorization` block for these users (JSON is valid nats-server config)."""
    entries = [{"user": u.user, "password": u.password_hash, "permissions": permissions(u.role, u.user, u.tenant)}
               for u in sorted(users, key=lambda u: u.user)]
    return "authorization " + json.dumps({"users": entries}, indent=1) + "\n"


def url_with_user(url: str, user: str, password: str) -> str:
    """`url` carrying a user and password, as nats clients take them (nats://user:password@host:port)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact(url: str) -> str:
    """`url` without its password, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def user_of(url: str) -> str | None:
    name = urlsplit(url).username
    return unquote(name) if name else None


def client_options(url: str) -> Mapping[str, Any]:
    """What a client of `url` passes to nats-py's connect besides the URL: its own inbox prefix."""
    user = user_of(url)
    return {"inbox_prefix": inbox_prefix(user)} if user else {}
