"""The cluster as a second way in (`up --kube`, `serve allocator --kube`): brokered ResourceClaims are
submitted to the queue like any tenant's claim, and the cluster is kept where the ledger is.

Level-triggered: a claim is marked due when the cluster changes it (its watch), when the broker publishes a
status for it (the status stream), at start and every `resync_s`; a due claim's ledger row is read and
`shared.kube_claims.writeback.plan` says what to write. So a restart, a relist, a missed event or a cluster
that drifted is mended by the same code as a new claim. Of several allocators, the one holding the writer's
lease in the ledger writes; every write carries the resourceVersion it was planned on, and a 409 re-reads the
claim and plans again. Pods carrying the gate `claimbroker.io/allocation` are ungated once every broker claim
they use is Allocated in the cluster.

Submissions go through the claims stream with a message id per cluster uid (exactly once, as a tenant's
would); statuses reach NATS as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException
from nats.aio.client import Client
from nats.js.api import DeliverPolicy
from nats.js.errors import APIError

from services.bus.streams import BACKLOG_FULL_CODE
from services.kube.reflector import Reflector
from services.kube.requests import KubeRequests
from shared.contract import subjects
from shared.kube_claims.cluster_claim import (
    FINALIZER,
    GATE,
    REASON_ANNOTATION,
    STATE_ANNOTATION,
    TENANT_ANNOTATION,
    ClusterClaim,
    Tenancy,
    gated,
    read_claim,
)
from shared.kube_claims.pods import CONDITION, Waits, pod_step, said_on
from shared.kube_claims.writeback import (
    Action,
    AddFinalizer,
    ClearAllocation,
    Evict,
    LedgerClaim,
    Release,
    RemoveFinalizer,
    Say,
    Submit,
    Wait,
    WriteAllocation,
    allocated_devices,
    plan,
)
from shared.ledger import cluster_claims as ledger
from shared.ledger.engine import sessions
from shared.ledger.handles import AsyncEngine

log = logging.getLogger("claimbroker.allocator.cluster")

CLAIMS, PODS = "resourceclaims", "pods"
COMPONENT = "claimbroker.io/allocator"
CONFLICT_RETRIES = 5
BACKLOG_WAIT_S = 30.0  # how long a publish waits for room in the tenant's backlog on the bus
RETRY_AFTER_S = 2.0  # a claim whose reconcile failed is due again after this (doubling), not at the next resync
RETRY_MAX_S = 60.0
GONE_KEPT = 10_000
EVICTED_FOR_S = 60.0  # an evicted pod is not evicted again for this long (its deletion is under way)
Key = tuple[str, str]


class NotWriter(Exception):
    """The writer's lease may have lapsed: no write until it is renewed."""


class Conflict(Exception):
    """The object moved since it was read (409): read it again and plan again."""


class ClusterClaims:
    def __init__(self, api: client.ApiClient, engine: AsyncEngine, nc: Client, *, holder: str,
                 namespaces: Mapping[str, str] | None = None, lease_s: float = 15.0, resync_s: float = 30.0,
                 clock: Callable[[], float] = time.time, reflector: Reflector | None = None,
                 concurrency: int = 32) -> None:
        self.api, self.nc, self.js = api, nc, nc.jetstream()
        self.resource, self.core = client.ResourceV1Api(api), client.CoreV1Api(api)  # lists for the reflectors
        self.requests = KubeRequests(api)  # every write, and the reads of one object
        self.sessions = sessions(engine)
        self.holder, self.namespaces = holder, dict(namespaces or {})
        self.lease_s, self.resync_s, self.clock = lease_s, resync_s, clock
        self.concurrency = concurrency  # claims reconciled at once: requests in flight to the API server
        self.reflector = reflector or Reflector(api)
        self.claims: dict[Key, ClusterClaim] = {}  # the broker's claims (annotated, or still holding its finalizer)
        self.others: dict[Key, ClusterClaim] = {}  # every other claim: seen (a pod may use it), and what it holds
        # (driver, pool, device) -> the claim, the broker's or not, holding it in the cluster
        self.holders: dict[tuple[str, str, str], Key] = {}
        self.uids: dict[str, Key] = {}  # the broker's claims by cluster uid
        self.gone: dict[Key, int] = {}  # the resourceVersion a claim was deleted at: a late write answer is no news
        self.waiting: set[Key] = set()  # claims whose devices another cluster claim still holds
        self.pods: dict[Key, dict[str, Any]] = {}
        self.synced: set[str] = set()
        self.due: set[Key] = set()
        self.wake = asyncio.Event()
        self.leader = False
        self.lease_until = 0.0  # monotonic: no write to the cluster after it unless the lease was renewed
        self.failures: dict[Key, int] = {}  # a claim's reconciles that failed in a row: its retry backs off
        self.evicted: dict[str, float] = {}  # pod uid -> when its eviction was accepted (not asked again soon)
        self.tenancy = Tenancy(self.namespaces, frozenset())
        self.writes: dict[str, int] = {}  # per kind of write, for tests and metrics

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.reflector.reflect(CLAIMS, self.resource.list_resource_claim_for_all_namespaces,
                                                     self._replace_claims, self._claim_event))
            # a gated pod is Pending: the API server filters the others out (on a busy cluster, nearly all)
            group.create_task(self.reflector.reflect(PODS, self.core.list_pod_for_all_namespaces,
                                                     self._replace_pods, self._pod_event,
                                                     field_selector="status.phase=Pending"))
            group.create_task(self._follow_statuses())
            group.create_task(self._keep_lease())
            group.create_task(self._work())

    async def release_lease(self) -> None:
        """At a clean stop: the writer's lease goes now, not when it would have expired."""
        if not self.leader:
            return
        try:
            async with self.sessions() as session, session.begin():
                await ledger.release_writer_lease(session, self.holder, self.clock())
        except Exception as error:  # the ledger away: the lease expires by itself
            log.info("cluster claims: the writer's lease not let go (%r); it expires in %gs", error, self.lease_s)
        self.leader, self.lease_until = False, 0.0

    # --- what the cluster and the bus say ---------------------------------------------------------

    async def _replace_claims(self, items: list[dict[str, Any]]) -> None:
        """A (re)list: the cache becomes the list, except where a write's answer we hold is newer than it
        (a list taken while that write was in flight)."""
        before = {**self.others, **self.claims}
        self.claims, self.others, self.holders, self.uids = {}, {}, {}, {}
        for claim in map(read_claim, items):
            held = before.get(claim.key)
            self._store(held if held is not None and _version(held) > _version(claim) else claim)
        self.synced.add(CLAIMS)
        self._mark(self.claims)  # a relist: everything is due, drift included

    async def _claim_event(self, kind: str, item: dict[str, Any]) -> None:
        claim = read_claim(item)
        held = self.claims.get(claim.key) or self.others.get(claim.key)
        if kind == "DELETED":
            self._gone(claim)
        if kind == "DELETED":
            self._forget(claim.key)
        elif not _ours(claim):
            self._store(claim)
        else:
            self.gone.pop(claim.key, None)
            # our own write's answer came first: no news
            echo = held is not None and _ours(held) and _version(held) >= _version(claim)
            self._store(claim)
            if not echo:
                self._mark([claim.key])
        if held is not None and held.allocation is not None and (kind == "DELETED" or claim.allocation is None):
            self._mark(self.waiting)  # devices freed in the cluster: the claims waiting for them may go on
        self._mark_pods_of(claim.namespace, claim.name)

    async def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        self.pods = {_pod_key(pod): pod for pod in items if gated(pod)}
        self.synced.add(PODS)
        self.wake.set()

    async def _pod_event(self, kind: str, item: dict[str, Any]) -> None:
        key = _pod_key(item)
        if kind == "DELETED" or not gated(item):
            self.pods.pop(key, None)
        else:
            self.pods[key] = item
            self.wake.set()

    async def _follow_statuses(self) -> None:
        """Each status the broker publishes makes its cluster claim due (the ledger is read for what to do)."""
        async def due(message: Any) -> None:
            with contextlib.suppress(ValueError):
                tenant, token = subjects.status_parts(message.subject)
                for namespace in self.tenancy.namespaces_of(tenant):
                    if (namespace, subjects.name_of(token)) in self.claims:
                        self._mark([(namespace, subjects.name_of(token))])
        while True:
            try:
                subscription = await self.js.subscribe(subjects.STATUS_ALL, ordered_consumer=True,
                                                       deliver_policy=DeliverPolicy.NEW, cb=due)
                try:
                    await asyncio.Event().wait()
                finally:
                    with contextlib.suppress(Exception):
                        await subscription.unsubscribe()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the bus away: the resync still comes
                log.warning("cluster claims: following statuses failed (%r); again in 2s", error)
                await asyncio.sleep(2.0)

    def _mark(self, keys: Any) -> None:
        self.due.update(keys)
        self.wake.set()

    def _mark_pods_of(self, namespace: str, name: str) -> None:
        if any(k[0] == namespace for k in self.pods):
            self.wake.set()

    # --- keeping the cluster where the ledger is --------------------------------------------------

    async def _keep_lease(self) -> None:
        """Renew the writer's lease every third of it, on its own (a reconcile may outlast the lease); a write
        is made only before `lease_until`, two thirds of a lease after the last renewal, so the lease of a
        writer that stopped renewing has lapsed in the ledger before another can take it and write."""
        while True:
            asked = time.monotonic()
            try:
                await self._hold_lease()
                self.lease_until = asked + self.lease_s * 2 / 3 if self.leader else 0.0
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the ledger away: no writes once the lease may have lapsed
                log.warning("cluster claims: the writer's lease not renewed (%r)", error)
            await asyncio.sleep(self.lease_s / 3)

    def _may_write(self) -> None:
        if time.monotonic() >= self.lease_until:
            raise NotWriter()

    async def _work(self) -> None:
        next_resync = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=min(self.lease_s / 3, self.resync_s))
            self.wake.clear()
            try:
                if not self.leader or self.synced != {CLAIMS, PODS}:
                    continue
                if time.monotonic() >= next_resync:
                    next_resync = time.monotonic() + self.resync_s
                    self.due.update(self.claims)
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the ledger or the API server away: try again at the next wake
                log.warning("cluster claims: reconcile failed (%r); again shortly", error)
                await asyncio.sleep(1.0)

    async def _hold_lease(self) -> None:
        async with self.sessions() as session, session.begin():
            leader = await ledger.hold_writer_lease(session, self.holder, self.clock(), self.lease_s)
            tenancy = Tenancy(self.namespaces, frozenset(await ledger.tenant_names(session)))
        if tenancy != self.tenancy:  # a namespace may have gained (or lost) its tenant: every claim is due
            self.tenancy = tenancy
            self.due.update(self.claims)
        if leader != self.leader:
            log.info("cluster claims: %s the cluster writer's lease", "holding" if leader else "not holding")
            self.leader = leader
            if leader:
                self.due.update(self.claims)
                self.wake.set()

    async def reconcile(self) -> None:
        """Every due claim, then every gated pod; each claim guarded on its own (one failure is logged and
        the claim stays due), so no claim can stop the others."""
        keys, self.due = sorted(self.due), set()
        wanted = {k: self.tenancy.tenant_for(self.claims[k]) if k in self.claims else None for k in keys}
        try:
            async with self.sessions() as session:
                found = await ledger.ledger_claims(session, {(t, k[1]) for k, t in wanted.items() if t is not None})
        except BaseException:
            self.due.update(keys)  # the ledger away: still due when it is back
            raise
        in_flight = asyncio.Semaphore(self.concurrency)

        async def one_claim(key: Key) -> None:
            tenant = wanted[key]
            async with in_flight:
                try:
                    await self._reconcile_claim(key, found.get((tenant, key[1])) if tenant is not None else None)
                except asyncio.CancelledError:
                    raise
                except NotWriter:
                    self.due.add(key)  # the next writer (maybe us again) takes it
                except Exception as error:
                    self._retry_later(key, error)
                else:
                    self.failures.pop(key, None)

        async def one_pod(key: Key) -> None:
            async with in_flight:
                try:
                    await self._ungate(key)
                except asyncio.CancelledError:
                    raise
                except NotWriter:
                    pass  # the next writer takes it
                except Exception as error:
                    log.warning("pod %s/%s: ungating failed: %r", *key, error)

        # claims are independent of one another: their round trips to the API server overlap
        async with asyncio.TaskGroup() as group:
            for key in keys:
                group.create_task(one_claim(key))
        async with asyncio.TaskGroup() as group:
            for pod_key in sorted(self.pods):
                group.create_task(one_pod(pod_key))

    def _retry_later(self, key: Key, error: Exception) -> None:
        """Due again after 2 s, doubling with each failure in a row up to a minute (a claim the API server
        refuses every time must not be asked every 2 s forever)."""
        failures = self.failures[key] = self.failures.get(key, 0) + 1
        delay = min(RETRY_MAX_S, RETRY_AFTER_S * 2 ** (failures - 1))
        log.warning("cluster claim %s/%s: %r; tried again in %gs", *key, error, delay)
        asyncio.get_running_loop().call_later(delay, self._mark, [key])

    async def _reconcile_claim(self, key: Key, own: LedgerClaim | None) -> None:
        for _ in range(CONFLICT_RETRIES):
            claim = self.claims.get(key)
            if claim is None:
                return
            try:
                for action in plan(claim, own, self.tenancy, self._held_elsewhere, self._live_claim):
                    claim = await self._carry_out(claim, action)
                return
            except Conflict:
                await self._refresh(key)
        log.warning("cluster claim %s/%s: still conflicting after %d tries; tried again later", *key,
                    CONFLICT_RETRIES)
        self.due.add(key)

    def _store(self, claim: ClusterClaim) -> None:
        """The cache of the cluster's claims (the broker's in `claims`, the others in `others`), who holds each
        device there (`holders`: a claim kube-scheduler allocated holds its devices as much as ours do) and the
        broker's claims by uid."""
        self._forget(claim.key)
        if _ours(claim):
            self.claims[claim.key] = claim
            self.uids[claim.uid] = claim.key
        else:
            self.others[claim.key] = claim
        for device in allocated_devices(claim.allocation):
            self.holders[device] = claim.key

    def _forget(self, key: Key) -> None:
        held = self.claims.pop(key, None) or self.others.pop(key, None)
        if held is not None:
            if self.uids.get(held.uid) == key:
                del self.uids[held.uid]
            for device in allocated_devices(held.allocation):
                if self.holders.get(device) == key:
                    del self.holders[device]

    def _gone(self, claim: ClusterClaim) -> None:
        """Remember a deleted claim's last version, the newest GONE_KEPT of them (a write's answer comes back
        within seconds of its deletion; older entries only grow the map)."""
        self.gone.pop(claim.key, None)
        self.gone[claim.key] = _version(claim)
        while len(self.gone) > GONE_KEPT:
            del self.gone[next(iter(self.gone))]

    def _live_claim(self, uid: str) -> str | None:
        key = self.uids.get(uid)
        return f"{key[0]}/{key[1]}" if key is not None else None

    def _held_elsewhere(self, claim: ClusterClaim, allocation: Mapping[str, Any]) -> str | None:
        for device in allocated_devices(allocation):
            holder = self.holders.get(device)
            if holder is not None and holder != claim.key:
                self.waiting.add(claim.key)
                return f"{holder[0]}/{holder[1]}"
        self.waiting.discard(claim.key)
        return None

    async def _carry_out(self, claim: ClusterClaim, action: Action) -> ClusterClaim:
        """One action; returns the claim as the cluster now has it (writes answer the new object)."""
        if not isinstance(action, Wait):
            self._may_write()
        match action:
            case AddFinalizer(tenant=tenant):
                return await self._patch_meta(claim, {"finalizers": [*claim.finalizers, FINALIZER],
                                                      "annotations": {TENANT_ANNOTATION: tenant}}, "finalizer")
            case RemoveFinalizer():
                return await self._patch_meta(claim, {"finalizers": [f for f in claim.finalizers if f != FINALIZER]},
                                              "finalizer-removed")
            case Submit(tenant=tenant, document=document):
                await self._publish(subjects.submit(tenant), document, f"kube-{claim.uid}", "submit")
            case Release(tenant=tenant, name=name, uid=uid):
                await self._publish(subjects.release(tenant), {"name": name}, f"kube-release-{uid}", "release")
            case WriteAllocation(allocation=allocation):
                return await self._write_status(claim, dict(allocation))
            case ClearAllocation():
                return await self._write_status(claim, None)
            case Evict(pods=pods, message=message):
                await self._evict(claim, pods, message)
            case Say(state=state, reason=reason):
                said = await self._patch_meta(claim, {"annotations": {STATE_ANNOTATION: state,
                                                                      REASON_ANNOTATION: reason}}, "said")
                await self._event(claim.document, claim.namespace, action.event_type, state,
                                  reason or f"the broker's state: {state}")
                return said
            case Wait(why=why):
                log.debug("cluster claim %s/%s waits: %s", claim.namespace, claim.name, why)
        return claim

    # --- writes -----------------------------------------------------------------------------------

    def _count(self, kind: str) -> None:
        self.writes[kind] = self.writes.get(kind, 0) + 1

    async def _patch_meta(self, claim: ClusterClaim, meta: dict[str, Any], kind: str) -> ClusterClaim:
        body = {"metadata": {"resourceVersion": claim.resource_version, **meta}}
        try:
            updated = await self.requests.patch_claim(claim.namespace, claim.name, body)
        except ApiException as error:
            if error.status == 409:
                raise Conflict() from error
            raise
        self._count(kind)
        return self._keep(updated)

    async def _write_status(self, claim: ClusterClaim, allocation: dict[str, Any] | None) -> ClusterClaim:
        document = json.loads(json.dumps(claim.document))
        document.setdefault("apiVersion", "resource.k8s.io/v1")
        document.setdefault("kind", "ResourceClaim")
        status = document.setdefault("status", {}) or {}
        document["status"] = status
        if allocation is None:
            status.pop("allocation", None)
        else:
            status["allocation"] = {**allocation, "allocationTimestamp": _now_rfc3339(self.clock())}
        try:
            updated = await self.requests.replace_claim_status(claim.namespace, claim.name, document)
        except ApiException as error:
            if error.status == 409:
                raise Conflict() from error
            raise
        self._count("allocation" if allocation is not None else "allocation-cleared")
        return self._keep(updated)

    async def _refresh(self, key: Key) -> None:
        try:
            current = await self.requests.read_claim(key[0], key[1])
        except ApiException as error:
            if error.status == 404:
                self._forget(key)
                return
            raise
        self._keep(current)

    def _keep(self, updated: dict[str, Any]) -> ClusterClaim:
        """The object a write answered, kept unless the cache knows newer (its watch got there first)."""
        claim = read_claim(updated)
        freed = self.claims.get(claim.key)
        if claim.deleting and not claim.finalizers:  # that write deleted it
            self._gone(claim)
            self._forget(claim.key)
        elif self._newer(claim):
            self._store(claim)
        if freed is not None and freed.allocation is not None and (self.claims.get(claim.key) is None
                                                                   or claim.allocation is None):
            self._mark(self.waiting - {claim.key})
        return claim

    def _newer(self, claim: ClusterClaim) -> bool:
        if self.gone.get(claim.key, -1) >= _version(claim):
            return False
        held = self.claims.get(claim.key)
        if held is None:
            return _ours(claim)
        return _version(claim) >= _version(held)

    async def _publish(self, subject: str, payload: Mapping[str, Any], message_id: str, kind: str) -> None:
        """As a tenant publishes: a tenant's backlog on the bus is bounded (settings.tenant_backlog), and a
        publish past it waits for the allocator to take some, pausing longer each time."""
        pause, deadline = 0.01, time.monotonic() + BACKLOG_WAIT_S
        while True:
            try:
                await self.js.publish(subject, json.dumps(payload).encode(), headers={"Nats-Msg-Id": message_id})
            except APIError as error:
                if error.err_code != BACKLOG_FULL_CODE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(0.16, pause * 2)
                continue
            self._count(kind)
            return

    async def _evict(self, claim: ClusterClaim, pods: Any, message: str) -> None:
        now = time.monotonic()
        self.evicted = {uid: at for uid, at in self.evicted.items() if now - at < EVICTED_FOR_S}
        for pod in pods:
            if pod.resource != "pods" or pod.uid in self.evicted:
                continue  # being evicted: its reservation goes when it is gone
            try:
                await self.requests.evict_pod(claim.namespace, pod.name, pod.uid)
            except ApiException as error:
                if error.status == 404:
                    continue  # gone already: the claim controller clears its reservation
                if error.status == 429:  # a disruption budget: asked again shortly
                    log.info("pod %s/%s: eviction refused for now (%s)", claim.namespace, pod.name, error.reason)
                    asyncio.get_running_loop().call_later(RETRY_AFTER_S, self._mark, [claim.key])
                    continue
                raise
            self.evicted[pod.uid] = now
            self._count("eviction")
            await self._event({"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": pod.name, "namespace": claim.namespace, "uid": pod.uid}},
                              claim.namespace, "Warning", "Preempted", message)

    async def _event(self, obj: Mapping[str, Any], namespace: str, kind: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        at = _now_rfc3339(self.clock())
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": namespace},
            "involvedObject": {"apiVersion": obj.get("apiVersion", "resource.k8s.io/v1"),
                               "kind": obj.get("kind", "ResourceClaim"), "name": meta.get("name"),
                               "namespace": namespace, "uid": meta.get("uid")},
            "reason": reason, "message": message[:1024], "type": kind, "firstTimestamp": at, "lastTimestamp": at,
            "count": 1, "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": self.holder[:128]}
        try:
            await self.requests.create_event(namespace, event)
        except ApiException as error:  # an event is news, not state: its loss is logged, not retried
            log.info("event for %s/%s not written: %s %s", namespace, meta.get("name"), error.status, error.reason)
        else:
            self._count("event")

    async def _ungate(self, key: Key) -> None:
        """Remove the gate once the pod's broker claims are Allocated in the cluster, else say why it waits."""
        pod = self.pods.get(key)
        if pod is None:
            return
        claims = {name: claim for (namespace, name), claim in self.claims.items() if namespace == key[0]}
        seen = {name for namespace, name in (*self.claims, *self.others) if namespace == key[0]}
        step = pod_step(pod, claims, seen)
        version = (pod.get("metadata") or {}).get("resourceVersion")
        self._may_write()
        if isinstance(step, Waits):
            if said_on(pod, step):
                return
            conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != CONDITION]
            body: dict[str, Any] = {"metadata": {"resourceVersion": version},
                                    "status": {"conditions": [*conditions, step.condition(_now_rfc3339(self.clock()))]}}
            patch, kind = self.requests.patch_pod_status, "pod-condition"
        else:
            if any(c.get("type") == CONDITION for c in (pod.get("status") or {}).get("conditions") or []):
                await self._mark_allocated(key, pod)  # what it said while it waited no longer holds
                pod = self.pods.get(key, pod)
                version = (pod.get("metadata") or {}).get("resourceVersion")
            gates = [g for g in (pod.get("spec") or {}).get("schedulingGates") or [] if g.get("name") != GATE]
            body = {"metadata": {"resourceVersion": version}, "spec": {"schedulingGates": gates or None}}
            patch, kind = self.requests.patch_pod, "ungate"
        try:
            updated = await patch(key[0], key[1], body)
        except ApiException as error:
            if error.status in (404, 409):
                return  # gone, or moved: its watch event brings it back if it still needs us
            raise
        if kind == "ungate":
            self.pods.pop(key, None)
        elif key in self.pods:
            self.pods[key] = updated
        self._count(kind)

    async def _mark_allocated(self, key: Key, pod: dict[str, Any]) -> None:
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != CONDITION]
        done = {"type": CONDITION, "status": "True", "reason": "Allocated",
                "message": "every broker claim of the pod is Allocated",
                "lastTransitionTime": _now_rfc3339(self.clock())}
        body = {"metadata": {"resourceVersion": (pod.get("metadata") or {}).get("resourceVersion")},
                "status": {"conditions": [*conditions, done]}}
        self.pods[key] = await self.requests.patch_pod_status(key[0], key[1], body)
        self._count("pod-condition")


def _ours(claim: ClusterClaim) -> bool:
    """Claims the broker decides, and those it still holds a finalizer on (annotation since removed)."""
    return claim.brokered or FINALIZER in claim.finalizers


def _version(claim: ClusterClaim) -> int:
    """resourceVersions are opaque to clients, but etcd's are increasing integers: compared only to tell a
    late answer from news; one that is not a number counts as news."""
    try:
        return int(claim.resource_version)
    except ValueError:
        return 1 << 62


def _pod_key(pod: Mapping[str, Any]) -> Key:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _now_rfc3339(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
