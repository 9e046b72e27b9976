"""Typed settings, read once at the edge (CLI or service entry point) and passed in.

`BrokerSettings` reads them all: the environment (CLAIMBROKER_*) and the CLI's options. Each service takes
its own group of them (`BusSettings`, `AllocatorSettings`, `NotifierSettings`, `WatcherSettings`,
`AdminApiSettings`), which the composition roots get from `BrokerSettings`' properties of the same names:
a service's constructor says what it reads. A group's fields are named as BrokerSettings' (and so as their
variables), their values the same."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")


def parse_duration(value: str | float | int) -> float:
    """'10m', '30s', '1.5h', '250ms', '30d' or plain seconds."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value.strip())
    if not match:
        raise ValueError(f"invalid duration {value!r}: use e.g. 30s, 10m, 1h, 30d")
    number, unit = float(match[1]), match[2] or "s"
    return number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


class Webhook(BaseModel):
    """One alert sink. `slack` posts Slack's {"text", "blocks"}; `json` posts the alert payload itself."""

    url: str
    format: Literal["json", "slack"] = "json"
    min_severity: Literal["info", "warning", "critical"] = "info"

    @classmethod
    def parse(cls, value: str) -> Webhook:
        """The CLI form: `URL` (json) or `slack:URL`."""
        if value.startswith("slack:"):
            return cls(url=value.removeprefix("slack:"), format="slack")
        return cls(url=value)


@dataclasses.dataclass(frozen=True)
class BusSettings:
    """Where NATS is and how the contract's streams are kept; the embedded server's sync and TLS; bus auth and
    each tenant's account limits."""

    nats_url: str | None
    tls_ca: Path | None
    nats_sync: str
    nats_tls_cert: Path | None
    nats_tls_key: Path | None
    stream_replicas: int
    tenant_backlog: int
    insecure: bool
    bus_auth_poll_interval: float
    bus_auth_file: Path | None
    nats_pid_file: Path | None
    bus_passwords: Mapping[str, str]
    tenant_connections: int
    tenant_subscriptions: int
    tenant_consumers: int
    tenant_status_bytes: int


@dataclasses.dataclass(frozen=True)
class AllocatorSettings:
    """The allocator's: its batches and deliveries, the decision cycle's limits, the inbox's retention, and
    the inventory files its device classes come from."""

    tls_ca: Path | None
    inventory: list[Path]
    allocator_batch: int
    allocator_ack_wait: float
    max_deliver: int
    inventory_ttl: float
    reason_refresh: float
    min_runtime: float
    gang_reserve_after: float
    tenant_placement_budget: int
    placement_continue_after: float
    inbox_retention: float
    early_releases_per_tenant: int
    estimate_interval: float
    # The cluster's ResourceClaims as a second way in (`--kube`): the cluster to follow, and which tenant a
    # namespace's claims belong to where it is not named as one.
    kube: bool
    kubeconfig: Path | None
    kube_namespaces: dict[str, str]


@dataclasses.dataclass(frozen=True)
class NotifierSettings:
    """The notifier's: its status consumer, the alerts (when, how often, where: webhooks), the usage checks
    and the MIG advice."""

    tls_ca: Path | None
    ack_wait: float
    max_deliver: int
    inbox_retention: float
    inventory_ttl: float
    pending_alert_after: float
    alert_fold_window: float
    alert_rate_per_key: float
    alert_rate_per_tenant: float
    webhooks: list[Webhook]
    webhook_attempts: int
    webhook_base_delay: float
    usage_check_interval: float
    mig_advice_min: int
    mig_advice_window: float


@dataclasses.dataclass(frozen=True)
class WatcherSettings:
    """The watcher's: its inventory source (the cluster, this host's GPUs, else files) and how often it
    looks and republishes."""

    tls_ca: Path | None
    kube: bool
    kubeconfig: Path | None
    nvml: bool
    node_name: str | None
    nvml_poll_interval: float
    inventory: list[Path]
    inventory_poll_interval: float
    heartbeat_interval: float


@dataclasses.dataclass(frozen=True)
class AdminApiSettings:
    """The admin API's: where it listens (and its TLS), how it judges alerts and nodes, and what its heavy
    requests may spend."""

    tls_ca: Path | None
    api_host: str
    api_port: int
    api_tls_cert: Path | None
    api_tls_key: Path | None
    pending_alert_after: float
    inventory_ttl: float
    admin_jobs: int
    admin_queue: int
    admin_job_timeout: float
    admin_job_memory: int
    admin_max_body: int
    whatif_max_nodes: int
    whatif_max_devices: int
    quota_import_max_tenants: int
    quota_import_max_quotas: int


_Group = TypeVar("_Group", bound="DataclassInstance")


def _group(group: type[_Group], settings: Any) -> _Group:
    """The group's fields, each the value of the settings' field of its name."""
    return group(**{field.name: getattr(settings, field.name)
                    for field in dataclasses.fields(group)})


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLAIMBROKER_", extra="ignore")

    nats_url: str | None = None
    # `serve X` answers /healthz and /readyz on this port when set (services.runtime.health); deployments bind 0.0.0.0
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    log_format: Literal["text", "json"] = "text"  # json: one object a line, and a line per decision batch
    # The embedded nats-server's JetStream sync: "always" (every write fsynced before its ack), "default"
    # (nats-server's, every 2 minutes) or a duration; see services.bus.embedded.EmbeddedNats.
    nats_sync: str = "always"
    # How many servers of a NATS cluster keep each stream: 3 on a three-node cluster (deploy/k8s), 1 on one server.
    stream_replicas: int = 1
    # Claims a tenant may have waiting on the bus (per tenant, for submissions and for releases); a publish
    # past it is refused until the allocator takes some, so one tenant's flood cannot bury the others': what
    # waits ahead of another tenant's claim is this many of each tenant's at most. Smaller is fairer, larger
    # lets one tenant alone submit faster (`make bench-flood`, docs/performance.md).
    tenant_backlog: int = Field(default=16, ge=1)
    # Each tenant's own NATS account (shared/contract/bus_auth.py), so that what one tenant holds on the bus
    # costs only itself: connections at once (each may buffer up to nats-server's max_pending, 64 MiB, for
    # a slow reader), subscriptions per connection, JetStream consumers of its own, and the bytes of its
    # status stream (the last status of each claim; the oldest claims' go first when it is full).
    tenant_connections: int = Field(default=32, ge=1)
    tenant_subscriptions: int = Field(default=512, ge=1)
    tenant_consumers: int = Field(default=16, ge=1)
    tenant_status_bytes: int = Field(default=32 * 1024 * 1024, ge=64 * 1024)
    db: str | None = None
    data_dir: Path = Path(".claimbroker")
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # TLS. Clients (services, CLI) trust `tls_ca` (a PEM bundle) for NATS and the admin API; without it, the
    # system's CAs. The admin API serves HTTPS with api_tls_cert/key; `up`'s embedded nats-server serves
    # TLS with nats_tls_cert/key (an external server's TLS is its own configuration).
    tls_ca: Path | None = None
    api_tls_cert: Path | None = None
    api_tls_key: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # The embedded nats-server asks every client for a credential (shared/contract/bus_auth.py) unless `insecure`,
    # which leaves the bus open to anyone who reaches it: labs only. The ledger's credentials are re-read
    # this often (a credential created or revoked through the admin API of the same process applies at once).
    insecure: bool = False
    bus_auth_poll_interval: float = 0.5
    # `serve bus-auth`, beside an external nats-server: the file its config includes, the server's pid file
    # (SIGHUP reloads it), and the passwords of the services' and the admin's users, by name (JSON in
    # CLAIMBROKER_BUS_PASSWORDS: {"allocator": ..., "notifier": ..., "watcher": ..., "admin": ...}).
    bus_auth_file: Path | None = None
    nats_pid_file: Path | None = None
    bus_passwords: dict[str, str] = {}

    @model_validator(mode="after")
    def _tls_pairs(self) -> BrokerSettings:
        for server in ("api", "nats"):
            if (getattr(self, f"{server}_tls_cert") is None) != (getattr(self, f"{server}_tls_key") is None):
                raise ValueError(f"{server}_tls_cert and {server}_tls_key go together: set both or neither")
        return self
    inventory: list[Path] = []
    kube: bool = False
    pending_alert_after: float = 600.0
    inventory_poll_interval: float = 2.0  # the file watcher wakes this often (heartbeats); edits come as events
    # Claim messages decided per transaction at most: a backlog is taken in large batches (fixed costs
    # per transaction amortised: 2.5 times the claims/s of 64 under a burst), a trickle as it comes.
    allocator_batch: int = 512
    ack_wait: float = 30.0  # the notifier's consumer
    # The allocator's: what a killed allocator held is redelivered after it, and a live one marks what it
    # holds in progress every third of it, so a kill costs seconds.
    allocator_ack_wait: float = 5.0
    max_deliver: int = 10
    # A Pending claim's reason is worked out again this often (its numbers drift as the fleet changes);
    # in between it keeps its answer, so a deep queue costs a cycle nothing.
    reason_refresh: float = 60.0
    # A running claim is not preempted for fair share or reclaim sooner than this after its allocation, unless
    # its tenant's minRuntime (Quotas) says otherwise: preemption that does not thrash. Priority preemption
    # within a tenant is not held back.
    min_runtime: float = 120.0
    # A gang first in its tenant's fair-share order this long keeps the devices it needs as they free, unless
    # its tenant's gangReserveAfter (Quotas) says otherwise (0: off): no gang waits forever behind small claims.
    gang_reserve_after: float = Field(default=300.0, ge=0.0)
    # What one tenant's claims may spend on placement per decision cycle (the units of shared/dra/budget.py,
    # about 4 us each): a claim whose search costs more goes on in later cycles, so a tenant's expensive
    # claims wait their turn while other tenants' claims are decided beside them.
    tenant_placement_budget: int = Field(default=2_000, ge=200)
    # While such work is left over, the allocator runs another cycle this long after the last (between
    # them it takes messages as they come): how fast expensive claims progress, at what share of its time.
    placement_continue_after: float = Field(default=0.1, gt=0.0)
    # How long the ledger keeps a consumed message's id (its inbox: a message re-sent within it, same tenant,
    # kind and id, changes nothing) and a release of a claim it has no row of (its submission, delivered
    # after it, still ends Released). Far above any redelivery (allocator_ack_wait x max_deliver), and above
    # the 10 minutes JetStream's duplicate window gave before it went down to its 100 ms floor.
    inbox_retention: float = Field(default=3600.0, ge=600.0)
    # Releases of unknown claims remembered per tenant at most, the oldest forgotten first: a flood of
    # releases of names never submitted cannot grow the ledger, and costs only its own tenant.
    early_releases_per_tenant: int = Field(default=1000, ge=1)
    # Start estimates (issue 39): worked out by the estimator, a service beside the allocator (`up` runs it in
    # a process of its own, `serve estimator` alone), at most this often (seconds), and only when the queue
    # or the fleet moved since (else once a minute); 0 turns them off.
    estimate_interval: float = Field(default=5.0, ge=0.0)

    @field_validator("pending_alert_after", "reason_refresh", "min_runtime", "gang_reserve_after", "inbox_retention",
                     mode="before")
    @classmethod
    def _duration(cls, value: str | float) -> float:
        return parse_duration(value)

    # Alerts (notifier). Rates are messages per minute (also the burst); 0 turns a limit off.
    alert_fold_window: float = 300.0
    alert_rate_per_key: float = 6.0
    alert_rate_per_tenant: float = 60.0
    inventory_ttl: float = 90.0
    webhooks: list[Webhook] = []
    webhook_attempts: int = 5
    webhook_base_delay: float = 0.5

    @field_validator("alert_fold_window", "inventory_ttl", "webhook_base_delay", mode="before")
    @classmethod
    def _alert_duration(cls, value: str | float) -> float:
        return parse_duration(value)

    @field_validator("webhooks", mode="before")
    @classmethod
    def _webhooks(cls, value: object) -> object:
        """Accept `URL` and `slack:URL` strings next to full objects."""
        if isinstance(value, list):
            return [Webhook.parse(v) if isinstance(v, str) else v for v in value]
        return value

    # Watcher inventory sources. `kube` (above) reads the cluster; `nvml` this host's GPUs.
    kubeconfig: Path | None = None  # None: in-cluster ServiceAccount, else ~/.kube/config
    # With `kube`, the allocator takes the cluster's brokered ResourceClaims: a namespace is the tenant of its
    # name unless mapped here ("ml-prod=vision,ml-dev=vision").
    kube_namespaces: Annotated[dict[str, str], NoDecode] = {}
    nvml: bool = False
    node_name: str | None = None  # the NVML source's node (from the downward API); None: the hostname
    heartbeat_interval: float = 30.0  # republish unchanged nodes this often, well inside inventory_ttl
    nvml_poll_interval: float = 10.0

    @field_validator("kube_namespaces", mode="before")
    @classmethod
    def _namespace_map(cls, value: object) -> object:
        """`ns=tenant,ns2=tenant` as well as a JSON object."""
        if isinstance(value, str):
            pairs = [p.strip() for p in value.split(",") if p.strip()]
            if any(p.count("=") != 1 or p.startswith("=") or p.endswith("=") for p in pairs):
                raise ValueError(f"expected namespace=tenant pairs separated by commas, got {value!r}")
            return dict(p.split("=") for p in pairs)
        return value

    @field_validator("heartbeat_interval", "nvml_poll_interval", mode="before")
    @classmethod
    def _watcher_duration(cls, value: str | float) -> float:
        return parse_duration(value)

    @model_validator(mode="after")
    def _heartbeats_inside_the_ttl(self) -> BrokerSettings:
        """A node is stale once inventory_ttl passes without a message from it (shared/fleet/freshness.py):
        with heartbeats less than twice as frequent, a late poll or a lost heartbeat greys a live node."""
        if self.inventory_ttl < 2 * self.heartbeat_interval:
            raise ValueError(f"inventory_ttl ({self.inventory_ttl:g}s) must be at least twice heartbeat_interval "
                             f"({self.heartbeat_interval:g}s), or live nodes turn stale between heartbeats")
        return self

    def database_url(self) -> str:
        return self.db or f"sqlite+aiosqlite:///{(self.data_dir / 'ledger.db').resolve()}"

    # How often the notifier reads quota usage and pending demand from the ledger (quota-near-limit,
    # idle-larger-flavor): a few GROUP BYs per pass, so seconds are cheap but minutes are enough.
    usage_check_interval: float = 30.0
    # mig-relayout-suggested: the notifier plans a MIG re-layout at each usage check while claims for a MIG
    # device wait, and alerts once a plan would admit at least mig_advice_min of them for mig_advice_window
    # seconds (0: no such advice).
    mig_advice_min: int = Field(default=1, ge=0)
    mig_advice_window: float = 600.0

    @field_validator("usage_check_interval", "mig_advice_window", mode="before")
    @classmethod
    def _usage_duration(cls, value: str | float) -> float:
        return parse_duration(value)

    # Heavy admin requests (what-if, quota import and export) run in worker processes beside the allocator,
    # never on the event loop `up` shares with it (services/admin_api/offload.py). At most admin_jobs run at
    # once and admin_queue wait for one; one more is answered 503 at once. Each is answered within
    # admin_job_timeout: a job still waiting or running then is stopped, 503. A job may allocate
    # admin_job_memory bytes (0: no limit) before it is stopped, 503. Past the sizes below a request is
    # refused before any work: a body over admin_max_body 413 (every route), more nodes or devices (GPUs)
    # added in a what-if, or tenants or quotas in an import, 422 naming the number and the limit. Defaults
    # from docs/performance.md: a 5,000-node what-if takes about 7 s and 0.5 GB; 10,000 tenants import in 1 s.
    admin_jobs: int = Field(default=1, ge=1)
    admin_queue: int = Field(default=4, ge=0)
    admin_job_timeout: float = Field(default=60.0, gt=0)
    admin_job_memory: int = Field(default=2 * 2**30, ge=0)
    admin_max_body: int = Field(default=16 * 2**20, ge=1024)
    whatif_max_nodes: int = Field(default=5_000, ge=1)
    whatif_max_devices: int = Field(default=40_000, ge=1)
    quota_import_max_tenants: int = Field(default=10_000, ge=1)
    quota_import_max_quotas: int = Field(default=100_000, ge=1)

    @field_validator("admin_job_timeout", mode="before")
    @classmethod
    def _admin_duration(cls, value: str | float) -> float:
        return parse_duration(value)

    @property
    def bus(self) -> BusSettings:
        return _group(BusSettings, self)

    @property
    def allocator(self) -> AllocatorSettings:
        return _group(AllocatorSettings, self)

    @property
    def notifier(self) -> NotifierSettings:
        return _group(NotifierSettings, self)

    @property
    def watcher(self) -> WatcherSettings:
        return _group(WatcherSettings, self)

    @property
    def admin_api(self) -> AdminApiSettings:
        return _group(AdminApiSettings, self)
