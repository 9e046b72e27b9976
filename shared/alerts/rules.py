"""Alert rules: claim statuses, inventory messages and quota/flavor figures in, Raise/Resolve actions out.

Pure: the little memory rules need (when a claim started waiting, when a node last reported) lives in
these objects, and time comes in as an argument. The AlertBook decides what is actually published.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.alerts.book import Action, Alert, Raise, Resolve, alert_key
from shared.alerts.gangs import GangRule, GangWait
from shared.contract.gang_reasons import read_incomplete
from shared.contract.messages import ClaimStatus
from shared.fleet import telemetry
from shared.fleet.freshness import iso, judge

CLAIM_REJECTED = "claim-rejected"
PENDING_TOO_LONG = "claim-pending-too-long"
UNSATISFIABLE = "claim-unsatisfiable"
PREEMPTED = "claim-preempted"
NODE_LOST = "node-lost"
INVENTORY_STALE = "inventory-stale"
DEVICE_UNHEALTHY = "device-unhealthy"
DEVICE_THROTTLED = "device-throttled"
QUOTA_NEAR_LIMIT = "quota-near-limit"
IDLE_LARGER_FLAVOR = "idle-larger-flavor"
MIG_RELAYOUT = "mig-relayout-suggested"


@dataclass
class _Waiting:
    since: float
    reason: str
    alerted: bool = False
    # while its last reason says its gang lacks members: that gang's wait (closed once it resolved, until
    # the member's own status changes)
    gang: GangWait | None = None


class ClaimRules:
    """claim-rejected, claim-pending-too-long, claim-unsatisfiable, claim-preempted and gang-incomplete from
    statuses. A member of an incomplete gang raises no claim-pending-too-long of its own while its reason is
    the gang's: its gang raises one gang-incomplete instead (one raised before, while the gang was whole and
    waited for devices, stays open until the claim stops pending); once the gang is complete its members'
    waits count from when each began to wait, as any claim's."""

    def __init__(self, pending_alert_after: float) -> None:
        self.default_after = pending_alert_after
        self.thresholds: dict[str, float] = {}  # per tenant, from the ledger's tenants table
        self.waiting: dict[tuple[str, str], _Waiting] = {}
        # Per claim, the sequence of the last status read, while the claim lives (Released ends it): a status
        # published again after a failed publish can arrive after a newer one, and must not undo it.
        self.sequences: dict[tuple[str, str], int] = {}
        self.gangs = GangRule()

    def seed(self, tenant: str, name: str, *, since: float, reason: str, alerted: bool) -> None:
        """A claim that was already waiting when the notifier (re)started, as the ledger says."""
        entry = self.waiting[(tenant, name)] = _Waiting(since=since, reason=reason, alerted=alerted)
        if (reading := read_incomplete(reason)) is not None:
            entry.gang = self.gangs.join(tenant, reading, since)

    def seed_gang_alert(self, tenant: str, gang: str) -> None:
        """A gang-incomplete alert open when the notifier (re)started (after the claims are seeded)."""
        self.gangs.restore(tenant, gang)

    def threshold(self, tenant: str) -> float:
        return self.thresholds.get(tenant, self.default_after)

    def on_status(self, status: ClaimStatus, now: float) -> list[Action]:
        """What a claim's status raises and resolves; `status` as `read_status` gives it (typed, checked)."""
        tenant, name, state = status["namespace"], status["name"], status["state"]
        sequence = status.get("sequence")
        if isinstance(sequence, int):
            if sequence <= self.sequences.get((tenant, name), 0):
                return []  # older than what was read already
            if state == "Released":
                self.sequences.pop((tenant, name), None)
            else:
                self.sequences[(tenant, name)] = sequence
        claim = f"{tenant}/{name}"
        reason = str(status.get("reason") or "")
        labels = {"tenant": tenant, "claim": name}
        out: list[Action] = []
        rejected = alert_key(CLAIM_REJECTED, tenant, name)
        if state == "Rejected":
            out.append(Raise(Alert(CLAIM_REJECTED, "warning", rejected, f"claim {claim} was rejected: {reason}",
                                   {"reason": reason, "sequence": status.get("sequence")}, labels)))
        else:
            out.append(Resolve(rejected, f"claim {claim} is no longer rejected ({state})"))

        out.extend(self._gang(tenant, name, state, reason, now))
        unsatisfiable = alert_key(UNSATISFIABLE, tenant, name)
        pending = alert_key(PENDING_TOO_LONG, tenant, name)
        if state == "Pending":
            entry = self.waiting.setdefault((tenant, name), _Waiting(since=now, reason=reason))
            entry.reason = reason
            if status.get("unsatisfiable") is True:
                out.append(Raise(Alert(
                    UNSATISFIABLE, "critical", unsatisfiable,
                    f"claim {claim} cannot be satisfied by any device in the fleet: {reason}",
                    {"reason": reason}, labels)))
            else:
                out.append(Resolve(unsatisfiable, f"claim {claim} could now be satisfied by the fleet"))
        else:
            self.waiting.pop((tenant, name), None)
            out.append(Resolve(pending, f"claim {claim} is no longer pending ({state})"))
            out.append(Resolve(unsatisfiable, f"claim {claim} is no longer pending ({state})"))

        preempted = alert_key(PREEMPTED, tenant, name)
        if state == "Preempted":
            by = status.get("by")
            summary = f"claim {claim} was preempted" + (f" by {by}" if by else "") + (f": {reason}" if reason else "")
            out.append(Raise(Alert(PREEMPTED, "warning", preempted, summary,
                                   {"by": by, "reason": reason}, labels)))
        elif state in ("Allocated", "Released"):
            out.append(Resolve(preempted, f"claim {claim} is {state.lower()} again"))
        return out

    def _gang(self, tenant: str, name: str, state: str, reason: str, now: float) -> list[Action]:
        """The claim joins, stays in or leaves its gang's wait (before `waiting` sees the status)."""
        reading = read_incomplete(reason) if state == "Pending" else None
        entry = self.waiting.get((tenant, name))
        wait = entry.gang if entry is not None else None
        if wait is not None and wait.open and reading is not None and reading.gang == wait.reading.gang:
            wait.reading = reading  # still waiting for members: the gang's latest numbers
            return []
        out: list[Action] = []
        if entry is not None and wait is not None:
            complete = state == "Allocated" or (state == "Pending" and reading is None)
            out = self.gangs.leave(wait, name, state, reason, complete=complete)
            entry.gang = None
        if reading is not None:
            entry = self.waiting.setdefault((tenant, name), _Waiting(since=now, reason=reason))
            entry.gang = self.gangs.join(tenant, reading, now)
        return out

    def due(self, now: float) -> list[Action]:
        """Claims that have waited past their tenant's threshold, each alerted once per wait (a member of
        an incomplete gang only once the gang is complete), and gangs incomplete past it."""
        out: list[Action] = self.gangs.due(now, self.threshold)
        for (tenant, name), entry in self.waiting.items():
            after = self.threshold(tenant)
            if entry.alerted or now - entry.since < after or entry.gang is not None:
                continue
            entry.alerted = True
            waited = now - entry.since
            claim = f"{tenant}/{name}"
            out.append(Raise(Alert(
                PENDING_TOO_LONG, "warning", alert_key(PENDING_TOO_LONG, tenant, name),
                f"claim {claim} has been pending for {waited:.0f}s (threshold {after:.0f}s): {entry.reason}",
                {"reason": entry.reason, "pendingSeconds": round(waited, 1), "thresholdSeconds": after},
                {"tenant": tenant, "claim": name})))
        return out


@dataclass
class _Node:
    last_heard: float
    stale: bool = False


class InventoryRules:
    """node-lost, inventory-stale, device-unhealthy and device-throttled from inventory messages. A node's
    freshness is judged as the allocator and /v1/nodes judge it (shared/fleet/freshness.py): last heard is
    its newest message's observedAtUnix, heartbeats included."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.nodes: dict[str, _Node] = {}
        self.lost: set[str] = set()

    def seed(self, *, stale: Iterable[str] = (), lost: Iterable[str] = ()) -> None:
        """Nodes whose inventory-stale or node-lost alert the ledger holds open (a restart): a message that
        shows the node fresh, or back, resolves it. Nodes these rules already know keep what they know."""
        for node in stale:
            if node not in self.nodes:
                self.nodes[node] = _Node(last_heard=float("-inf"), stale=True)
        self.lost.update(node for node in lost if node not in self.nodes)

    def on_inventory(self, payload: Mapping[str, Any], now: float) -> list[Action]:
        node = payload.get("node")
        if not isinstance(node, str) or not node:
            return []
        labels = {"node": node}
        lost_key, stale_key = alert_key(NODE_LOST, node), alert_key(INVENTORY_STALE, node)
        if payload.get("removed"):
            if node not in self.nodes and node not in self.lost:
                return []  # a node we never had (e.g. its removal is the stream's last word on it)
            self.nodes.pop(node, None)
            self.lost.add(node)
            return [Raise(Alert(NODE_LOST, "critical", lost_key, f"node {node} left the fleet",
                                {"sequence": payload.get("sequence")}, labels)),
                    Resolve(stale_key, f"node {node} left the fleet")]
        heard = _number(payload.get("observedAtUnix"), now)
        out: list[Action] = []
        if node in self.lost:
            self.lost.discard(node)
            out.append(Resolve(lost_key, f"node {node} is back"))
        entry = self.nodes.setdefault(node, _Node(heard))
        entry.last_heard = max(entry.last_heard, heard)
        if entry.stale and not judge(entry.last_heard, now, self.ttl).stale:
            entry.stale = False
            out.append(Resolve(stale_key, f"node {node} reports inventory again"))
        out.extend(_device_actions(node, payload.get("telemetry")))
        return out

    def due(self, now: float) -> list[Action]:
        """Stale nodes, each alerted once until it is heard again."""
        out: list[Action] = []
        for node, entry in self.nodes.items():
            verdict = judge(entry.last_heard, now, self.ttl)
            if entry.stale or not verdict.stale:
                continue
            entry.stale = True
            age = verdict.age or 0.0
            out.append(Raise(Alert(
                INVENTORY_STALE, "warning", alert_key(INVENTORY_STALE, node),
                f"node {node}: {verdict.reason} ({age:.0f}s ago); no new claim is placed on it",
                {"ageSeconds": round(age, 1), "ttlSeconds": self.ttl, "lastHeard": iso(entry.last_heard)},
                {"node": node})))
        return out


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _device_actions(node: str, payload: Any) -> list[Action]:
    """Health per device (verdict from shared.fleet.telemetry): Unhealthy is critical, Throttled a warning,
    Healthy ends both. Unreadable telemetry raises nothing rather than guessing."""
    try:
        devices = telemetry.from_json(payload if isinstance(payload, Mapping) else None)
    except (TypeError, ValueError, AttributeError):
        return []
    out: list[Action] = []
    for device, reading in sorted(devices.items()):
        unhealthy, throttled = alert_key(DEVICE_UNHEALTHY, node, device), alert_key(DEVICE_THROTTLED, node, device)
        details = reading.to_json()
        labels = {"node": node, "device": device}
        where = f"{node}/{device}"
        if reading.health == "Unhealthy":
            ecc = reading.ecc_uncorrected
            out.append(Raise(Alert(DEVICE_UNHEALTHY, "critical", unhealthy,
                                   f"device {where} is unhealthy" + (f" ({ecc} uncorrected ECC errors)" if ecc else ""),
                                   details, labels)))
            out.append(Resolve(throttled, f"device {where} is no longer throttled (now Unhealthy)"))
        elif reading.health == "Throttled":
            reasons = ", ".join(reading.throttle_reasons) or "unknown reason"
            out.append(Raise(Alert(DEVICE_THROTTLED, "warning", throttled,
                                   f"device {where} is throttled at {reading.temperature_c}°C: {reasons}",
                                   details, labels)))
            out.append(Resolve(unhealthy, f"device {where} is no longer unhealthy (now Throttled)"))
        else:
            out.append(Resolve(unhealthy, f"device {where} is healthy again"))
            out.append(Resolve(throttled, f"device {where} is healthy again"))
    return out


@dataclass(frozen=True)
class QuotaUsage:
    """One tenant's use of one flavor, in devices. borrowing_limit None: borrowing is unbounded, so the
    limit that can be approached is the nominal quota."""

    tenant: str
    flavor: str
    used: int
    nominal: int
    borrowing_limit: int | None = None


def quota_near_limit(usages: Iterable[QuotaUsage], threshold: float = 0.9) -> list[Action]:
    """Raise when a tenant uses at least `threshold` of nominal + borrowingLimit; resolve below it."""
    out: list[Action] = []
    for usage in usages:
        key = alert_key(QUOTA_NEAR_LIMIT, usage.tenant, usage.flavor)
        limit = usage.nominal + (usage.borrowing_limit or 0)
        if limit > 0 and usage.used >= threshold * limit:
            out.append(Raise(Alert(
                QUOTA_NEAR_LIMIT, "warning", key,
                f"tenant {usage.tenant} uses {usage.used} of {limit} {usage.flavor} devices "
                f"(nominal {usage.nominal}, borrowing limit {usage.borrowing_limit})",
                {"used": usage.used, "nominal": usage.nominal, "borrowingLimit": usage.borrowing_limit,
                 "limit": limit, "threshold": threshold},
                {"tenant": usage.tenant, "flavor": usage.flavor})))
        else:
            out.append(Resolve(key, f"tenant {usage.tenant} uses {usage.used} of {limit} {usage.flavor} devices"))
    return out


def idle_larger_flavor(
    pending: Mapping[str, int], idle: Mapping[str, int], values: Mapping[str, float]
) -> list[Action]:
    """Claims wait for flavor A while a flavor worth more (a larger `value`) has idle devices: the
    claims could be rewritten to accept it. One alert per waiting flavor, resolved when that stops."""
    out: list[Action] = []
    for flavor in sorted(set(pending) | set(values)):
        key = alert_key(IDLE_LARGER_FLAVOR, flavor)
        waiting = pending.get(flavor, 0)
        value = values.get(flavor, 0.0)
        larger = {other: count for other, count in sorted(idle.items())
                  if count > 0 and values.get(other, 0.0) > value}
        if waiting > 0 and larger:
            names = ", ".join(f"{count} {other}" for other, count in larger.items())
            out.append(Raise(Alert(
                IDLE_LARGER_FLAVOR, "info", key,
                f"{waiting} claim(s) wait for {flavor} while larger flavors idle: {names}",
                {"waiting": waiting, "idle": larger, "value": value}, {"flavor": flavor})))
        else:
            out.append(Resolve(key, f"no claims wait for {flavor} while a larger flavor idles"))
    return out


class MigAdviceRule:
    """mig-relayout-suggested: a MIG re-layout of idle GPUs would admit at least `minimum` waiting claims,
    and has for `window` seconds (a plan that comes and goes with each claim is no advice); resolved when
    no such plan is left. The plan is worked out by the caller (shared/admission/mig_plan.py)."""

    def __init__(self, minimum: int, window: float) -> None:
        self.minimum, self.window = minimum, window
        self.since: float | None = None

    def on_plan(self, gained: int, layouts: Sequence[Mapping[str, Any]], now: float) -> list[Action]:
        key = alert_key(MIG_RELAYOUT)
        if gained < self.minimum or not layouts:
            self.since = None
            return [Resolve(key, "no MIG re-layout would admit more waiting claims")]
        if self.since is None:
            self.since = now
        if now - self.since < self.window:
            return []
        gpus = ", ".join(f"{g['node']} GPU {g['gpu']} to {g['planned']}" for g in layouts[:5])
        more = f" and {len(layouts) - 5} more" if len(layouts) > 5 else ""
        return [Raise(Alert(MIG_RELAYOUT, "info", key,
                            f"re-laying {len(layouts)} idle GPU(s) would admit {gained} waiting claim(s): "
                            f"{gpus}{more} (claimbroker advise mig -o yaml)",
                            {"gained": gained, "layouts": list(layouts)}, {}))]
