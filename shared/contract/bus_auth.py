"""Who may do what on the NATS bus: identities, their permissions, and nats-server's `accounts` block.

The mechanism is nats-server's own users with bcrypt-hashed passwords, in a file the broker renders from
the ledger and the server re-reads on a config reload (SIGHUP), rather than an auth callout service:
- the server keeps authenticating when the broker is down (a callout makes every connection wait on the
  broker, and a broker that cannot start cannot be let in to fix itself);
- a reload re-checks every live connection, so a revoked credential loses its connection at once, where a
  callout only decides new connections (a kick needs the system account);
- nothing secret is written: the file holds bcrypt hashes, which the server checks itself.
The cost: a NATS cluster needs the file on each server (docs/operations.md, Bus credentials).

Each tenant is an account of its own, not a user of the broker's. Inside one account, whatever a client
asks the server to do answers on a subject the client names (a publish's acknowledgement, a JetStream API
reply, a consumer's deliveries), and permissions check only what the client publishes itself: a tenant
could have the server publish onto another tenant's submit subject or into the broker's streams. Between
accounts only what is exported and imported crosses, so:
- the broker's account (`CLAIMBROKER`: the services, the bus admin, every contract stream) exports to each
  tenant's account its submit and release subjects as services (a publish reaches the claims stream, its
  acknowledgement comes back, and a reply subject a tenant names stays in its own account) and its
  statuses and alerts as streams;
- a tenant's account (`tenant-<T>`) holds a `CLAIMBROKER_STATUS` stream of its own statuses, which the
  broker provisions through the tenant's exported stream API and backfills through its exported status
  subjects (services/bus/authority.py). A tenant reads it by direct get, or with consumers of its own,
  capped by its account's JetStream limits: exhausting them costs only itself. The account's limits cap its
  connections and each connection's subscriptions;
- fleet-wide alert readers share the `ALERTS` account, which imports every alert.

Every identity gets its own inbox prefix (`_I.<user>`). Names are dotted subject tokens:
`tenant.<tenant>.<id>`, `alerts.<id>` (every alert), `alerts.<tenant>.<id>` (one tenant's alerts),
`service.<name>`, `admin.<name>`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from shared.contract import subjects

INBOX = "_I"
ROLES = ("tenant", "alerts")
SERVICES = ("allocator", "notifier", "watcher", "admin-api")
BROKER_ACCOUNT = "CLAIMBROKER"
ALERTS_ACCOUNT = "ALERTS"
OPEN_USER = "open"  # `up --insecure`: every client, unauthenticated, in the broker's account
BACKFILLED = "claimbroker.io/backfilled"  # a tenant stream's metadata once the broker copied its statuses in

_SERVICE_JS = ["$JS.API.>", "$JS.ACK.>", "$JS.FC.>"]
_SERVICE_SUBJECTS = {
    # the allocator also submits and releases the cluster's claims (`--kube`) for their tenants: no more
    # than it does already, since it decides every tenant's claims
    "allocator": [subjects.STATUS_ALL, subjects.ALERTS_ALL, subjects.SUBMIT_ALL, subjects.RELEASE_ALL],
    "notifier": [subjects.ALERTS_ALL],
    "watcher": [subjects.INVENTORY_ALL, subjects.ALERTS_ALL],
    "admin-api": [],  # it reads: the page's live feed, the node map and what-if's fleet
}
# What a service hears as it happens besides its inbox (core subscriptions; streams it reads through the
# JetStream API, which delivers to its inbox).
_SERVICE_HEARS = {"admin-api": [subjects.STATUS_ALL, subjects.ALERTS_ALL, subjects.INVENTORY_ALL]}
_STATUS = subjects.STATUS_STREAM
# What a tenant may ask of JetStream in its own account: read its status stream (info, direct get, message
# get), and consumers of its own with their acks and flow control. Never create, change, purge or delete a
# stream, nor delete messages.
_TENANT_JS = ["$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", f"$JS.API.STREAM.INFO.{_STATUS}",
              f"$JS.API.STREAM.MSG.GET.{_STATUS}", f"$JS.API.DIRECT.GET.{_STATUS}", f"$JS.API.DIRECT.GET.{_STATUS}.>",
              "$JS.API.CONSUMER.>", f"$JS.ACK.{_STATUS}.>", f"$JS.FC.{_STATUS}.>"]
# The stream API of a tenant's account that the broker's account imports, under `provision_subject`.
PROVISION_API = {"create": f"$JS.API.STREAM.CREATE.{_STATUS}", "info": f"$JS.API.STREAM.INFO.{_STATUS}",
                 "update": f"$JS.API.STREAM.UPDATE.{_STATUS}"}


def inbox_prefix(user: str) -> str:
    """The only prefix under which `user` may receive replies and deliveries."""
    return f"{INBOX}.{user}"


def tenant_user(tenant: str, key: str) -> str:
    return f"tenant.{subjects.token(tenant)}.{subjects.token(key)}"


def alerts_user(key: str, tenant: str | None = None) -> str:
    """A fleet-wide alert reader's name, or one tenant's."""
    scope = f"{subjects.token(tenant)}." if tenant is not None else ""
    return f"alerts.{scope}{subjects.token(key)}"


def service_user(service: str) -> str:
    return f"service.{subjects.token(service)}"


def admin_user(name: str = "local") -> str:
    return f"admin.{subjects.token(name)}"


def tenant_of_user(user: str) -> str | None:
    """The tenant a tenant credential's user name belongs to, else None."""
    parts = user.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "tenant" else None


def tenant_account(tenant: str) -> str:
    return f"tenant-{subjects.token(tenant)}"


def status_filter(tenant: str, claim: str = ">") -> str:
    return f"{subjects.PREFIX}.claims.status.{tenant}.{claim}"


def provision_subject(tenant: str, operation: str) -> str:
    """Where the broker's account reaches a tenant account's stream API (`PROVISION_API`): a plain request
    of the bus admin, no identity inside the tenant's account."""
    return f"{subjects.PREFIX}.provision.{subjects.token(tenant)}.{operation}"


def backfill_subject(tenant: str, claim_token: str = ">") -> str:
    """A publish here lands on the tenant's account as `status_filter(tenant, claim_token)`."""
    return f"{provision_subject(tenant, 'status')}.{claim_token}"


@dataclass(frozen=True)
class TenantLimits:
    """What one tenant's account may hold (settings CLAIMBROKER_TENANT_*): connections at once,
    subscriptions per connection, JetStream consumers, and its status stream's bytes (times `replicas`, the
    servers that keep it)."""

    connections: int = 32
    subscriptions: int = 512
    consumers: int = 16
    status_bytes: int = 32 * 1024 * 1024
    replicas: int = 1


def tenant_status_stream(tenant: str, limits: TenantLimits) -> dict[str, Any]:
    """The config of a tenant account's status stream (JetStream's JSON): the last status of each of its
    claims, the oldest dropped first once its bytes are full; direct get for readers without a consumer;
    the broker's duplicate window, since a status re-sent after a crash reaches it again; a status that
    expires in the broker's stream (Nats-TTL: the answer to a release of an unknown claim) expires here too,
    where without allow_msg_ttl it would be dropped."""
    return {"name": _STATUS, "subjects": [status_filter(subjects.token(tenant))], "retention": "limits",
            "storage": "file", "discard": "old", "max_msgs_per_subject": 1, "max_bytes": limits.status_bytes,
            "max_msgs": -1, "max_age": 0, "max_consumers": -1, "num_replicas": limits.replicas,
            "allow_direct": True, "allow_msg_ttl": True, "duplicate_window": 600 * 10**9}


def permissions(role: str, user: str, tenant: str | None = None) -> dict[str, Any]:
    """The permissions of an identity, in nats-server's form, inside its account."""
    own_inbox = f"{inbox_prefix(user)}.>"
    if role == "tenant":
        if tenant is None:
            raise ValueError("a tenant credential names its tenant")
        return {"publish": {"allow": [subjects.submit(tenant), subjects.release(tenant), *_TENANT_JS]},
                "subscribe": {"allow": [own_inbox, status_filter(subjects.token(tenant))]}}
    if role == "alerts":
        reads = subjects.alerts_of(tenant) if tenant is not None else subjects.ALERTS_ALL
        return {"publish": {"deny": [">"]}, "subscribe": {"allow": [reads, own_inbox]}}
    if role == "service":
        service = user.removeprefix("service.")
        return {"publish": {"allow": [*_SERVICE_SUBJECTS[service], *_SERVICE_JS]},
                "subscribe": {"allow": [own_inbox, *_SERVICE_HEARS.get(service, [])]}}
    if role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    raise ValueError(f"unknown bus role {role!r}")


@dataclass(frozen=True)
class BusUser:
    user: str
    password_hash: str  # bcrypt: nats-server checks it itself
    role: str
    tenant: str | None = None

    @property
    def account(self) -> str:
        if self.tenant is not None:
            return tenant_account(self.tenant)
        return ALERTS_ACCOUNT if self.role == "alerts" else BROKER_ACCOUNT


def _user(u: BusUser) -> dict[str, Any]:
    return {"user": u.user, "password": u.password_hash, "permissions": permissions(u.role, u.user, u.tenant)}


def _tenant_exchange(tenant: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """What the broker's account exports to and imports from `tenant`'s, and the tenant's account less its
    users and limits."""
    broker, account = BROKER_ACCOUNT, tenant_account(tenant)
    offered = [subjects.submit(tenant), subjects.release(tenant)]
    streamed = [status_filter(tenant), subjects.alerts_of(tenant)]
    exports = ([{"service": s, "accounts": [account]} for s in offered]
               + [{"stream": s, "accounts": [account]} for s in streamed])
    provided = {**PROVISION_API, "status": status_filter(tenant)}
    imports = [{"service": {"account": account, "subject": api},
                "to": backfill_subject(tenant) if name == "status" else provision_subject(tenant, name)}
               for name, api in provided.items()]
    tenant_side = {
        "exports": [{"service": api, "accounts": [broker]} for api in provided.values()],
        "imports": ([{"service": {"account": broker, "subject": s}} for s in offered]
                    + [{"stream": {"account": broker, "subject": s}} for s in streamed]),
    }
    return exports, imports, tenant_side


def render_accounts(users: Iterable[BusUser], tenants: Iterable[str], limits: TenantLimits,
                    bare: Collection[str] = ()) -> str:
    """nats-server's `accounts` block (JSON is valid nats-server config): the broker's, an account for each
    of `tenants` (every tenant that ever had a credential: an account is never taken away from a running
    server, its stream keeps collecting statuses, and without users nobody enters it), and the fleet-wide
    alert readers'.

    The tenants in `bare` get their account alone: no users, nothing exported or imported. A reload that
    brings in an account together with its imports leaves the imports dead (nats-server 2.15: a request
    through them finds no responders, a stream import delivers nothing; in a cluster, see nats-server issue
    8560), where the same imports added to an account the server already has work: a new tenant's account
    is applied bare first (`staged`), then whole."""
    users = sorted(users, key=lambda u: u.user)
    names = sorted({*tenants, *(u.tenant for u in users if u.tenant is not None)})
    limited = {"max_connections": limits.connections, "max_subscriptions": limits.subscriptions}
    broker: dict[str, Any] = {"jetstream": "enabled", "users": [], "exports": [], "imports": []}
    accounts: dict[str, Any] = {BROKER_ACCOUNT: broker}
    for tenant in names:
        account = accounts[tenant_account(tenant)] = {
            "jetstream": {"max_mem": 0, "max_file": limits.status_bytes * limits.replicas, "max_streams": 1,
                          "max_consumers": limits.consumers},
            "limits": limited, "users": []}
        if tenant not in bare:
            exports, imports, tenant_side = _tenant_exchange(tenant)
            broker["exports"] += exports
            broker["imports"] += imports
            account.update(tenant_side)
    broker["exports"].append({"stream": subjects.ALERTS_ALL, "accounts": [ALERTS_ACCOUNT]})
    accounts[ALERTS_ACCOUNT] = {"limits": limited, "users": [],
                                "imports": [{"stream": {"account": BROKER_ACCOUNT, "subject": subjects.ALERTS_ALL}}]}
    for u in users:
        if u.tenant not in bare:
            accounts[u.account]["users"].append(_user(u))
    return "accounts " + json.dumps(accounts, indent=1) + "\n"


def served_tenants(text: str) -> set[str]:
    """The tenants with an account in a rendered `accounts` block (what a server reading it has)."""
    try:
        accounts = json.loads(text.removeprefix("accounts "))
    except ValueError:
        return set()
    prefix = tenant_account("x")[:-1]
    return {name.removeprefix(prefix) for name in accounts if name.startswith(prefix)}


def render_open() -> str:
    """`up --insecure`: the broker's account, entered by every client without a credential (the streams
    live in the same account as with credentials, so a data folder moves between the two)."""
    accounts = {BROKER_ACCOUNT: {"jetstream": "enabled", "users": [{"user": OPEN_USER, "password": ""}]}}
    return "accounts " + json.dumps(accounts, indent=1) + "\nno_auth_user: " + json.dumps(OPEN_USER) + "\n"


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
