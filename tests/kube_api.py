"""A fake Kubernetes API server for the tests: the calls the broker makes (list/watch, get, create, update,
patch, delete, the status subresource, evictions, Events) on nodes, ResourceSlices, ResourceClaims, pods,
Events and PodDisruptionBudgets, answered as the real API server answers them, plus the parts of the control
plane a test needs for a cluster that "runs pods" (kube-scheduler, the claim controller, the kubelet).

It runs in the test process (127.0.0.1, a random port, one thread per connection), so an e2e test can point
`claimbroker up --kube --kubeconfig FILE` at it (`write_kubeconfig`) and still arm faults and read the state
directly. The test side takes the same lock as the server side; `wait_for` blocks on it (from asyncio code,
`await api.until(...)`).

Semantics kept from the real server:
- a global resourceVersion bumped by every write; an update, status update or patch whose body carries a
  different metadata.resourceVersion answers 409 Conflict (the real wording); a write that changes nothing
  is not stored and sends no watch event, as etcd3's GuaranteedUpdate skips it;
- the status subresource writes `status` only, the main resource ignores `status`; create resets status
  (a pod gets phase Pending and, when gated, PodScheduled False SchedulingGated, as the pod strategy does);
- finalizers hold a DELETE (deletionTimestamp, deletionGracePeriodSeconds 0, MODIFIED); the update that
  removes the last one deletes the object, and its DELETED event carries the object as stored before that
  update (etcd's previous value) with the new resourceVersion; no finalizer may be added while deleting;
- ResourceClaim: spec immutable; status validation as ValidateClaimStatusUpdate: reservedFor needs an
  allocation, unique uids, no new entries while deleting; a set allocation is immutable (clear, then set);
  result requests must name a request of the spec;
- pods: spec.schedulingGates may only lose entries; nothing else in spec may change (stricter than the real
  server, which also lets images, tolerations additions and activeDeadlineSeconds change);
- bodies are decoded with the `kubernetes` client's models: a body they do not accept is 422 Invalid; a
  wrong apiVersion or kind is 400; fields the model does not know are dropped with a `Warning` header
  (fieldValidation=Strict: 400), as the real server does for unknown fields;
- watches per kind, all namespaces or one, with bookmarks, dropped connections and compaction (410 Gone)
  armed by the test; a watch without resourceVersion (or "0") starts with ADDED for each current object;
- evictions honour PodDisruptionBudgets (429 with the real message); more than one budget for a pod is 500.

Where it does not match the real server:
- no authentication, authorization, admission webhooks, namespaces objects, defaulting (a pod gets no
  restartPolicy, dnsPolicy...), server-side apply (application/apply-patch+yaml is 415), dryRun, pagination
  (limit/continue are ignored: a list is complete), protobuf/CBOR, resourceVersionMatch or list-from-cache
  semantics (a list is always the latest state), sendInitialEvents;
- field validation is the client model's (types and required fields), not the server's full validation;
- strategic merge patch is simplified: lists merge by key only for the field names in `MERGE_KEYS` (the pod,
  claim and metadata lists the broker may touch) and `finalizers` merge as a set, as the real patch
  strategies say; `$patch: delete|replace` and `$deleteFromPrimitiveList/` are honoured, `$setElementOrder`
  and `$retainKeys` ignored;
- label selectors: equality and existence terms only (`a=b`, `a!=b`, `a`, `!a`); field selectors: any dotted
  path with `=`/`==`/`!=` (the real server allows a few fields per kind); a selected watch filters events
  on the new object only (the real one turns an object leaving the selection into DELETED);
- a created object keeps a metadata.uid it was given (the real server always assigns one);
- an armed conflict (`arm_conflict`) answers 409 to any write, PATCH included, and moves the object's
  resourceVersion (a MODIFIED event) as the concurrent writer would; the real server retries a PATCH that
  carries no resourceVersion internally instead of answering 409;
- control plane: the scheduler binds only pods whose claims are all allocated already (it never allocates a
  claim itself, nor looks at resources, taints or nodeSelector; a pod without claims goes to the first Node by
  name); binding and the kubelet's Running are immediate; pods are deleted at once (no grace period, no
  kubelet "Killing" Event); the claim controller drops reservedFor entries of deleted or finished pods and
  does nothing else (no delete-protection finalizer); PodDisruptionBudget status is not maintained (the
  eviction check counts Running pods itself); an eviction writes no Event.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import json
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from kubernetes.aio import client
from pydantic import ValidationError

from services.watcher.kube import NODES, SLICES

CLAIMS = "resourceclaims"
PODS = "pods"
EVENTS = "events"
PDBS = "poddisruptionbudgets"
GATE = "claimbroker.io/allocation"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

Object = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """One REST resource: where it lives, what it is called in messages, which client model decodes it."""

    plural: str
    group: str  # "" for the core group
    version: str
    kind: str
    namespaced: bool
    model: Any
    has_status: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def group_resource(self) -> str:
        """As Conflict and NotFound messages name it: `resourceclaims.resource.k8s.io`, `pods`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        """As Invalid messages name it: `ResourceClaim.resource.k8s.io`, `Pod`."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


RESOURCES = {r.plural: r for r in (
    Resource(NODES, "", "v1", "Node", False, client.V1Node, True),
    Resource(SLICES, "resource.k8s.io", "v1", "ResourceSlice", False, client.V1ResourceSlice, False),
    Resource(CLAIMS, "resource.k8s.io", "v1", "ResourceClaim", True, client.ResourceV1ResourceClaim, True),
    Resource(PODS, "", "v1", "Pod", True, client.V1Pod, True),
    Resource(EVENTS, "", "v1", "Event", True, client.CoreV1Event, False),
    Resource(PDBS, "policy", "v1", "PodDisruptionBudget", True, client.V1PodDisruptionBudget, True),
)}

# Strategic merge patch: list fields merged by key (their patchMergeKey in the API types), by field name.
MERGE_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
              "schedulingGates": "name", "resourceClaims": "name", "resourceClaimStatuses": "name",
              "reservedFor": "uid", "ownerReferences": "uid", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath", "imagePullSecrets": "name", "ports": "containerPort"}
PRIMITIVE_MERGE = {"finalizers"}

ROUTE = re.compile(r"^(?P<prefix>/api/v1|/apis/[^/]+/[^/]+)(?:/namespaces/(?P<namespace>[^/]+))?"
                   r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<subresource>[^/]+))?)?/?$")


class FakeApiError(Exception):
    """An answer other than 2xx, with the v1 Status body the real server sends."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Object:
        body: Object = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body


def _not_found(r: Resource, name: str) -> FakeApiError:
    return FakeApiError(404, "NotFound", f'{r.group_resource} "{name}" not found',
                        {"name": name, "group": r.group, "kind": r.plural})


def _conflict(r: Resource, name: str) -> FakeApiError:
    return FakeApiError(409, "Conflict", f'Operation cannot be fulfilled on {r.group_resource} "{name}": the object '
                        "has been modified; please apply your changes to the latest version and try again",
                        {"name": name, "group": r.group, "kind": r.plural})


def _invalid(r: Resource, name: str, causes: list[tuple[str, str]]) -> FakeApiError:
    """causes: (field, message) pairs, e.g. ("spec", 'Invalid value: ...: field is immutable')."""
    text = ", ".join(f"{path}: {message}" if path else message for path, message in causes)
    return FakeApiError(422, "Invalid", f'{r.group_kind} "{name}" is invalid: {text}',
                        {"name": name, "group": r.group, "kind": r.kind,
                         "causes": [{"reason": "FieldValueInvalid", "message": message, "field": path}
                                    for path, message in causes]})


def _bad_request(message: str) -> FakeApiError:
    return FakeApiError(400, "BadRequest", message)


@dataclass(frozen=True)
class Request:
    """One answered request, for tests that count writes ("exactly one status write", "a 409 was retried")."""

    method: str
    path: str
    verb: str  # list, watch, get, create, update, patch, delete
    kind: str
    namespace: str | None
    name: str | None
    subresource: str  # "" for the main resource
    code: int
    content_type: str = ""
    warnings: tuple[str, ...] = ()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


@dataclass
class Selector:
    """labelSelector and fieldSelector of a list or watch: equality and existence terms."""

    labels: list[tuple[str, str, str | None]] = field(default_factory=list)  # (key, op, value)
    fields: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, label_selector: str, field_selector: str) -> Selector:
        selector = cls()
        for term in filter(None, (t.strip() for t in label_selector.split(","))):
            if match := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)", term):
                op = "!=" if match[2] == "!=" else "="
                selector.labels.append((match[1], op, match[3]))
            elif match := re.fullmatch(r"(!?)([\w./-]+)", term):
                selector.labels.append((match[2], "!" if match[1] else "exists", None))
            else:
                raise _bad_request(f"unable to parse requirement: {term!r} (the fake API server supports "
                                   "equality and existence terms only)")
        for term in filter(None, (t.strip() for t in field_selector.split(","))):
            if not (match := re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)):
                raise _bad_request(f"invalid field selector: {term!r}")
            selector.fields.append((match[1], "!=" if match[2] == "!=" else "=", match[3]))
        return selector

    def matches(self, obj: Object) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for key, op, value in self.labels:
            if op == "exists" and key not in labels or op == "!" and key in labels:
                return False
            if op == "=" and labels.get(key) != value or op == "!=" and labels.get(key) == value:
                return False
        for path, op, value in self.fields:
            found: Any = obj
            for part in path.split("."):
                found = found.get(part) if isinstance(found, dict) else None
            text = "" if found is None else str(found)
            if (text == value) != (op == "="):
                return False
        return True


def selects(selector: Object | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions) against labels; an empty one selects all."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values") or []
        if (op == "In" and labels.get(key) not in values or op == "NotIn" and labels.get(key) in values
                or op == "Exists" and key not in labels or op == "DoesNotExist" and key in labels):
            return False
    return True


class FakeApiServer:
    """Objects with resource versions, an event history per kind, and faults the test arms: a bookmark,
    a dropped connection, a compaction (watches from before it get an ERROR 410), write conflicts."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.version = 1000
        self.objects: dict[str, dict[str, Object]] = {kind: {} for kind in RESOURCES}
        self.history: dict[str, list[tuple[int, str, Object]]] = {kind: [] for kind in RESOURCES}
        self.compacted: dict[str, int] = {kind: 0 for kind in RESOURCES}
        self.lists: Counter[str] = Counter()
        self.watches: dict[str, list[tuple[str, bool]]] = {kind: [] for kind in RESOURCES}  # (version, bookmarks)
        self.faults: dict[str, list[str]] = {kind: [] for kind in RESOURCES}
        self.bookmarks_sent: list[int] = []
        self.requests: list[Request] = []
        self.conflicts = 0  # 409 Conflict answers: stale resourceVersions and armed conflicts
        self.armed_conflicts: Counter[tuple[str, str]] = Counter()  # (kind, key) -> writes still to refuse
        self.stopping = False
        self.url = ""
        # the rest of the control plane, each switchable by the test
        self.scheduler = True
        self.kubelet = True
        self.claim_controller = True
        self._settling = False
        self._reserving: set[str] = set()  # claims with reservedFor entries
        self._unbound: set[str] = set()  # pods for the scheduler: no node, no gates, not deleting
        self._starting: set[str] = set()  # pods for the kubelet: bound, Pending

    # test side ---------------------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: Object, *, record: bool = True) -> int:
        """Store `obj` as it is (no validation, no semantics): what happened in etcd. The control plane
        still reacts to it; watches and lists send it as given (even with an apiVersion the real server would
        have converted), while GET, PUT and PATCH see it as the endpoint's version."""
        with self.changed:
            obj = copy.deepcopy(obj)
            metadata = obj.setdefault("metadata", {})
            if RESOURCES[kind].namespaced:
                metadata.setdefault("namespace", "default")
            metadata.setdefault("uid", str(uuid.uuid4()))
            self._commit(kind, event, obj, record=record)
            self._settle()
            return self.version

    def arm(self, kind: str, fault: str) -> None:
        """A fault the next watch of `kind` meets: "bookmark" (sent if asked for) or "drop"."""
        with self.changed:
            self.faults[kind].append(fault)
            self.changed.notify_all()

    def arm_conflict(self, kind: str, namespace: str | None, name: str, times: int = 1) -> None:
        """The next `times` writes of this object answer 409, as if another writer got there first."""
        with self.changed:
            self.armed_conflicts[(kind, _key(namespace, name))] += times

    def compact(self, kind: str) -> None:
        """etcd compaction: history before now is gone; a watch from an older version gets 410."""
        with self.changed:
            self.compacted[kind] = self.version
            self.history[kind].clear()
            self.changed.notify_all()

    def wait_for(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        """Blocks until `condition` (evaluated under the lock, after each change) holds."""
        with self.changed:
            assert self.changed.wait_for(condition, timeout), "fake API server: condition not reached"

    async def until(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        """`wait_for` from asyncio code, without blocking the event loop."""
        await asyncio.to_thread(self.wait_for, condition, timeout)

    def get(self, kind: str, namespace: str | None, name: str) -> Object | None:
        with self.changed:
            found = self.objects[kind].get(_key(namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def items(self, kind: str, namespace: str | None = None) -> list[Object]:
        """The stored objects of a kind (one namespace or all), in name order."""
        with self.changed:
            return [copy.deepcopy(obj) for key, obj in sorted(self.objects[kind].items())
                    if namespace is None or obj["metadata"].get("namespace") == namespace]

    def create(self, kind: str, obj: Object) -> Object:
        """As a POST would (validation, uid, status reset, control plane); raises FakeApiError."""
        with self.changed:
            return self.create_object(kind, obj["metadata"].get("namespace", "default")
                                      if RESOURCES[kind].namespaced else None, obj)[0]

    def update(self, kind: str, obj: Object, *, subresource: str = "") -> Object:
        """As a PUT would (resourceVersion checked when the body has one); raises FakeApiError."""
        with self.changed:
            metadata = obj["metadata"]
            namespace = metadata.get("namespace", "default") if RESOURCES[kind].namespaced else None
            return self.update_object(kind, namespace, metadata["name"], obj, subresource)[0]

    def patch(self, kind: str, namespace: str | None, name: str, patch: Any, *, content_type: str = MERGE_PATCH,
              subresource: str = "") -> Object:
        with self.changed:
            return self.patch_object(kind, namespace, name, patch, content_type, subresource)[0]

    def delete(self, kind: str, namespace: str | None, name: str) -> Object:
        """As a DELETE would: finalizers hold it; raises FakeApiError (404) when there is none."""
        with self.changed:
            return self.delete_object(kind, namespace, name, {})

    def finish_pod(self, namespace: str, name: str, phase: str = "Succeeded") -> Object:
        """The kubelet reports the pod's containers ended (Succeeded or Failed)."""
        with self.changed:
            pod = self._stored(RESOURCES[PODS], namespace, name)
            status = {**(pod.get("status") or {}), "phase": phase}
            return self.update_object(PODS, namespace, name, {**pod, "status": status}, "status")[0]

    def events(self, namespace: str | None = None, *, reason: str | None = None,
               involved: str | None = None) -> list[Object]:
        """Core v1 Events written, oldest first; `involved` filters on involvedObject.name."""
        with self.changed:
            found = [e for e in self.objects[EVENTS].values()
                     if (namespace is None or e["metadata"].get("namespace") == namespace)
                     and (reason is None or e.get("reason") == reason)
                     and (involved is None or (e.get("involvedObject") or {}).get("name") == involved)]
            return copy.deepcopy(sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"])))

    def count(self, verb: str | None = None, kind: str | None = None, *, namespace: str | None = None,
              name: str | None = None, subresource: str | None = None, code: int | None = None) -> int:
        """Requests answered that match every filter given; subresource "" is the main resource only."""
        with self.changed:
            return sum(1 for r in self.requests
                       if (verb is None or r.verb == verb) and (kind is None or r.kind == kind)
                       and (namespace is None or r.namespace == namespace) and (name is None or r.name == name)
                       and (subresource is None or r.subresource == subresource) and (code is None or r.code == code))

    def writes(self, kind: str | None = None, **filters: Any) -> int:
        """Write requests (create, update, patch, delete) answered, with `count`'s filters."""
        return sum(self.count(verb, kind, **filters) for verb in ("create", "update", "patch", "delete"))

    # server side: reads ------------------------------------------------------------------------
    def list_body(self, kind: str, namespace: str | None = None, selector: Selector | None = None) -> bytes:
        with self.changed:
            self.lists[kind] += 1
            r = RESOURCES[kind]
            items = []
            for obj in self.objects[kind].values():
                if namespace and obj["metadata"].get("namespace") != namespace:
                    continue
                if selector is not None and not selector.matches(obj):
                    continue
                item = copy.deepcopy(obj)
                item.pop("apiVersion", None)  # the API server leaves these out of list items
                item.pop("kind", None)
                items.append(item)
            self.changed.notify_all()
            return json.dumps({"apiVersion": r.api_version, "kind": f"{r.kind}List",
                               "metadata": {"resourceVersion": str(self.version)}, "items": items}).encode()

    def read(self, kind: str, namespace: str | None, name: str) -> Object:
        with self.changed:
            return self._typed(RESOURCES[kind], copy.deepcopy(self._stored(RESOURCES[kind], namespace, name)))

    def stream(self, kind: str, since: int | None, bookmarks: bool, timeout: float,
               send: Callable[[Object], None], *, namespace: str | None = None,
               selector: Selector | None = None, version_text: str | None = None) -> str:
        """Send events after `since` (None: the current objects as ADDED first) until the timeout; returns
        how the stream ends: 'end' or 'drop'. Events are sent outside the lock, so a slow reader holds up
        nobody else."""
        deadline = time.monotonic() + timeout
        r = RESOURCES[kind]

        def wanted(obj: Object) -> bool:
            return ((not namespace or obj["metadata"].get("namespace") == namespace)
                    and (selector is None or selector.matches(obj)))

        batch: list[Object] = []
        with self.changed:
            self.watches[kind].append((version_text if version_text is not None else str(since), bookmarks))
            self.changed.notify_all()
            if since is not None and since < self.compacted[kind]:
                batch.append({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                          "message": f"too old resource version: {since}",
                                                          "reason": "Expired", "code": 410}})
                ending: str | None = "end"
            else:
                ending = None
                if since is None:
                    batch = [{"type": "ADDED", "object": self._typed(r, copy.deepcopy(obj))}
                             for _, obj in sorted(self.objects[kind].items()) if wanted(obj)]
            position = self.version if since is None else since
        while True:
            for event in batch:
                send(event)
            if ending is not None:
                return ending
            batch = []
            with self.changed:
                while not batch and ending is None:
                    if self.stopping or time.monotonic() >= deadline:
                        ending = "end"
                        break
                    history = self.history[kind]
                    for version, event_type, obj in history[bisect.bisect_right(history, position,
                                                                                key=lambda e: e[0]):]:
                        position = version
                        if wanted(obj):
                            batch.append({"type": event_type, "object": obj})
                    if batch:
                        break
                    if self.faults[kind]:
                        fault = self.faults[kind].pop(0)
                        if fault == "drop":
                            ending = "drop"
                        elif fault == "bookmark" and bookmarks:
                            self.version += 1  # versions move on with changes to other objects
                            position = self.version
                            self.bookmarks_sent.append(position)
                            batch.append({"type": "BOOKMARK", "object": {
                                "kind": r.kind, "apiVersion": r.api_version,
                                "metadata": {"resourceVersion": str(position)}}})
                            self.changed.notify_all()
                        continue
                    self.changed.wait(min(0.5, max(0.0, deadline - time.monotonic())))

    # server side: writes (callers hold the lock) -----------------------------------------------
    def create_object(self, kind: str, namespace: str | None, body: Any, *, strict: bool = False
                      ) -> tuple[Object, list[str]]:
        r = RESOURCES[kind]
        body = self._checked_type(r, body)
        if body.get("metadata") is None:
            body["metadata"] = {}
        metadata = body["metadata"]
        if not isinstance(metadata, dict):
            raise _invalid(r, "", [("metadata", "Invalid value: must be an object")])
        if r.namespaced:
            if metadata.get("namespace") not in (None, "", namespace):
                raise _bad_request("the namespace of the provided object does not match the namespace sent on "
                                   "the request")
            metadata["namespace"] = namespace
        if metadata.get("resourceVersion"):
            raise FakeApiError(500, "InternalError", "Internal error occurred: resourceVersion should not be set "
                               "on objects to be created")
        if not metadata.get("name") and metadata.get("generateName"):
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            metadata["name"] = metadata["generateName"] + suffix
        name = metadata.get("name") or ""
        if not name:
            raise _invalid(r, "", [("metadata.name", "Required value: name or generateName is required")])
        obj, warnings = self._decoded(r, name, body, strict)
        if _key(namespace, name) in self.objects[kind]:
            raise FakeApiError(409, "AlreadyExists", f'{r.group_resource} "{name}" already exists',
                               {"name": name, "group": r.group, "kind": r.plural})
        metadata = obj["metadata"]
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata["creationTimestamp"] = _now()
        metadata["generation"] = 1
        for system in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            metadata.pop(system, None)
        if r.has_status:
            obj.pop("status", None)
        if kind == PODS:
            spec = obj.get("spec") or {}
            if spec.get("nodeName") and spec.get("schedulingGates"):
                raise _invalid(r, name, [("spec.nodeName", "Forbidden: cannot be set until all schedulingGates have "
                                          "been cleared")])
            obj["status"] = {"phase": "Pending"}
            if (obj.get("spec") or {}).get("schedulingGates"):
                obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                "reason": "SchedulingGated", "lastTransitionTime": _now(),
                                                "message": "Scheduling is blocked due to non-empty scheduling "
                                                           "gates"}]
        stored = self._commit(kind, "ADDED", obj)
        self._settle()
        return copy.deepcopy(stored), warnings

    def update_object(self, kind: str, namespace: str | None, name: str, body: Any, subresource: str = "", *,
                      strict: bool = False) -> tuple[Object, list[str]]:
        r = RESOURCES[kind]
        body = self._checked_type(r, body)
        old = self._stored(r, namespace, name)
        metadata = body.get("metadata")
        if not isinstance(metadata, dict):
            metadata = body["metadata"] = {}
        if metadata.get("name") not in (None, "", name):
            raise _bad_request(f"the name of the object ({metadata['name']}) does not match the name on the URL "
                               f"({name})")
        if r.namespaced and metadata.get("namespace") not in (None, "", namespace):
            raise _bad_request("the namespace of the provided object does not match the namespace sent on the "
                               "request")
        metadata["name"] = name
        if r.namespaced:
            metadata["namespace"] = namespace
        decoded, warnings = self._decoded(r, name, body, strict)
        self._check_write(r, old, decoded["metadata"].get("resourceVersion"))
        if subresource == "status":
            new = copy.deepcopy(old)
            if decoded.get("status") is None:
                new.pop("status", None)
            else:
                new["status"] = decoded["status"]
        else:
            new = decoded
            new.pop("status", None)
            if old.get("status") is not None:
                new["status"] = copy.deepcopy(old["status"])
            self._check_metadata_update(r, old, new)
        normal_old, normal_new = self._normal(r, old), self._normal(r, new)
        if kind == CLAIMS:
            self._check_claim_update(r, old, new, normal_old, normal_new)
        if kind == PODS:
            self._check_pod_update(r, old, normal_old, normal_new)
        if normal_new == normal_old:
            return copy.deepcopy(self._typed(r, old)), warnings  # nothing changed: not written, no event
        if subresource != "status" and normal_new.get("spec") != normal_old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._commit(kind, "DELETED", copy.deepcopy(old))
            self._settle()
            return new, warnings
        stored = self._commit(kind, "MODIFIED", new)
        self._settle()
        return copy.deepcopy(stored), warnings

    def patch_object(self, kind: str, namespace: str | None, name: str, patch: Any, content_type: str,
                     subresource: str = "", *, strict: bool = False) -> tuple[Object, list[str]]:
        r = RESOURCES[kind]
        old = self._typed(r, copy.deepcopy(self._stored(r, namespace, name)))
        if content_type == JSON_PATCH:
            if not isinstance(patch, list):
                raise _bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
            patched = json_patch(old, patch)
        elif content_type == MERGE_PATCH:
            patched = merge_patch(old, patch)
        elif content_type == STRATEGIC_PATCH:
            patched = strategic_merge_patch(old, patch)
        else:
            raise FakeApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"accepted media types include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH} "
                               "(the fake API server has no server-side apply)")
        if not isinstance(patched, dict):
            raise _invalid(r, name, [("", "the patch result is not an object")])
        return self.update_object(kind, namespace, name, patched, subresource, strict=strict)

    def delete_object(self, kind: str, namespace: str | None, name: str, options: Any) -> Object:
        r = RESOURCES[kind]
        old = self._stored(r, namespace, name)
        if options:
            if not isinstance(options, dict):
                raise _bad_request("DeleteOptions: the body must be an object")
            try:
                client.V1DeleteOptions.from_dict(options)
            except (ValidationError, TypeError, ValueError) as error:
                raise _bad_request(f"DeleteOptions: {_validation_text(error)}") from None
            preconditions = options.get("preconditions") or {}
            uid, version = preconditions.get("uid"), preconditions.get("resourceVersion")
            if uid and uid != old["metadata"].get("uid"):
                raise FakeApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, UID in object "
                                   f"meta: {old['metadata'].get('uid')}", {"name": name, "group": r.group,
                                                                          "kind": r.plural})
            if version and version != old["metadata"].get("resourceVersion"):
                raise FakeApiError(409, "Conflict", f"Precondition failed: ResourceVersion in precondition: {version}"
                                   f", ResourceVersion in object meta: {old['metadata'].get('resourceVersion')}",
                                   {"name": name, "group": r.group, "kind": r.plural})
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(self._typed(r, old))
            deleting = copy.deepcopy(old)
            deleting["metadata"]["deletionTimestamp"] = _now()
            deleting["metadata"]["deletionGracePeriodSeconds"] = 0
            stored = self._commit(kind, "MODIFIED", deleting)
            self._settle()
            return copy.deepcopy(stored)
        stored = self._commit(kind, "DELETED", copy.deepcopy(old))
        self._settle()
        return copy.deepcopy(stored)

    def evict(self, namespace: str, name: str, body: Any) -> Object:
        """POST pods/{name}/eviction: deletes the pod unless a disruption budget forbids it (429)."""
        r = RESOURCES[PODS]
        if not isinstance(body, dict):
            raise _bad_request("Eviction: the body must be an object")
        if body.get("apiVersion") not in (None, "policy/v1", "policy/v1beta1") or body.get("kind") not in (
                None, "Eviction"):
            raise _bad_request(f"the API version in the data ({body.get('apiVersion')}) or kind "
                               f"({body.get('kind')}) is not policy/v1 Eviction")
        try:
            client.V1Eviction.from_dict(body)
        except (ValidationError, TypeError, ValueError) as error:
            raise FakeApiError(422, "Invalid", f'Eviction.policy "{name}" is invalid: {_validation_text(error)}'
                               ) from None
        if (body.get("metadata") or {}).get("name") not in (None, "", name):
            raise _bad_request(f"name in URL does not match name in Eviction object: {name}")
        pod = self._stored(r, namespace, name)
        if not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") == "Running":
            self._check_budget(pod)
        self.delete_object(PODS, namespace, name, body.get("deleteOptions") or {})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # semantics ---------------------------------------------------------------------------------
    def _commit(self, kind: str, event: str, obj: Object, *, record: bool = True) -> Object:
        """The one place objects change: a new resourceVersion, the store, the watch history."""
        self.version += 1
        r = RESOURCES[kind]
        obj["metadata"]["resourceVersion"] = str(self.version)
        key = _key(obj["metadata"].get("namespace") if r.namespaced else None, obj["metadata"]["name"])
        if event == "DELETED":
            self.objects[kind].pop(key, None)
        else:
            self.objects[kind][key] = obj
        self._index(kind, key, None if event == "DELETED" else obj)
        if record:
            self.history[kind].append((self.version, event, obj))
        self.changed.notify_all()
        return obj

    def _index(self, kind: str, key: str, obj: Object | None) -> None:
        """The objects the control plane has work on, so a write does not scan every claim and pod."""
        if kind == CLAIMS:
            reserved = obj is not None and bool((obj.get("status") or {}).get("reservedFor"))
            (self._reserving.add if reserved else self._reserving.discard)(key)
        elif kind == PODS:
            spec = (obj or {}).get("spec") or {}
            live = obj is not None and not obj["metadata"].get("deletionTimestamp")
            unbound = live and not spec.get("nodeName") and not spec.get("schedulingGates")
            starting = live and bool(spec.get("nodeName")) and (
                (obj or {}).get("status") or {}).get("phase", "Pending") == "Pending"
            (self._unbound.add if unbound else self._unbound.discard)(key)
            (self._starting.add if starting else self._starting.discard)(key)

    def _stored(self, r: Resource, namespace: str | None, name: str) -> Object:
        found = self.objects[r.plural].get(_key(namespace if r.namespaced else None, name))
        if found is None:
            raise _not_found(r, name)
        return found

    @staticmethod
    def _typed(r: Resource, obj: Object) -> Object:
        """An object as the endpoint's version serves it (the real server converts what it stores): objects
        stored by `apply` may lack apiVersion/kind, or carry another version."""
        obj["apiVersion"], obj["kind"] = r.api_version, r.kind
        return obj

    @staticmethod
    def _checked_type(r: Resource, body: Any) -> Object:
        if not isinstance(body, dict):
            raise _bad_request(f"the body must be a {r.kind} object")
        body = copy.deepcopy(body)
        if body.get("apiVersion") not in (None, "", r.api_version):
            raise _bad_request(f"the API version in the data ({body['apiVersion']}) does not match the expected API "
                               f"version ({r.api_version})")
        if body.get("kind") not in (None, "", r.kind):
            raise _bad_request(f"the kind in the data ({body['kind']}) does not match the expected kind ({r.kind})")
        body["apiVersion"], body["kind"] = r.api_version, r.kind  # missing ones default to the endpoint's
        return body

    @staticmethod
    def _decoded(r: Resource, name: str, body: Object, strict: bool) -> tuple[Object, list[str]]:
        """The body as the client's model reads it: unknown fields dropped (a warning, or 400 when strict)."""
        try:
            model = r.model.from_dict(body)
        except (ValidationError, TypeError, ValueError, AttributeError) as error:
            raise _invalid(r, name, [("", _validation_text(error))]) from None
        decoded: Object = json.loads(model.to_json())
        unknown = _unknown_fields(body, decoded)
        if unknown and strict:
            raise _bad_request(f'{r.kind} in version "{r.version}" cannot be handled as a {r.kind}: strict '
                               "decoding error: " + ", ".join(f'unknown field "{path}"' for path in unknown))
        return decoded, [f'unknown field "{path}"' for path in unknown]

    @staticmethod
    def _normal(r: Resource, obj: Object) -> Object:
        """For comparisons: what the model keeps, with timestamps in one format; the version left out."""
        try:
            normal: Object = json.loads(r.model.from_dict(obj).to_json())
        except (ValidationError, TypeError, ValueError, AttributeError):
            normal = copy.deepcopy(obj)
        (normal.get("metadata") or {}).pop("resourceVersion", None)
        return normal

    def _check_write(self, r: Resource, old: Object, version: str | None) -> None:
        """Optimistic concurrency: a stale resourceVersion, or an armed concurrent writer, is a 409."""
        key = _key(old["metadata"].get("namespace") if r.namespaced else None, old["metadata"]["name"])
        if self.armed_conflicts[(r.plural, key)] > 0:
            self.armed_conflicts[(r.plural, key)] -= 1
            self.conflicts += 1
            self._commit(r.plural, "MODIFIED", copy.deepcopy(old))  # the other writer's change
            raise _conflict(r, old["metadata"]["name"])
        if version and version != old["metadata"].get("resourceVersion"):
            self.conflicts += 1
            raise _conflict(r, old["metadata"]["name"])

    @staticmethod
    def _check_metadata_update(r: Resource, old: Object, new: Object) -> None:
        """System fields come from the stored object; no new finalizer once deletion started."""
        old_meta, new_meta = old["metadata"], new["metadata"]
        name = old_meta["name"]
        if new_meta.get("uid") not in (None, "", old_meta.get("uid")):
            raise _invalid(r, name, [("metadata.uid", f'Invalid value: "{new_meta["uid"]}": field is immutable')])
        for system in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if old_meta.get(system) is None:
                new_meta.pop(system, None)
            else:
                new_meta[system] = old_meta[system]
        if old_meta.get("deletionTimestamp"):
            added = [f for f in new_meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
            if added:
                listed = ", ".join(f'"{f}"' for f in added)
                raise _invalid(r, name, [("metadata.finalizers", "Forbidden: no new finalizers can be added if the "
                                          f"object is being deleted, found new finalizers []string{{{listed}}}")])

    @staticmethod
    def _check_claim_update(r: Resource, old: Object, new: Object, normal_old: Object, normal_new: Object) -> None:
        name = old["metadata"]["name"]
        if normal_new.get("spec") != normal_old.get("spec"):
            raise _invalid(r, name, [("spec", "Invalid value: field is immutable")])
        old_status, status = old.get("status") or {}, new.get("status") or {}
        causes: list[tuple[str, str]] = []
        reserved = status.get("reservedFor") or []
        seen: set[str] = set()
        for index, consumer in enumerate(reserved):
            for required in ("resource", "name", "uid"):
                if not consumer.get(required):
                    causes.append((f"status.reservedFor[{index}].{required}", "Required value"))
            if consumer.get("uid") in seen:
                causes.append((f"status.reservedFor[{index}]", f'Duplicate value: "{consumer.get("uid")}"'))
            seen.add(consumer.get("uid") or "")
        if reserved and not status.get("allocation"):
            causes.append(("status.reservedFor", "Forbidden: may not be specified when `allocated` is not set"))
        elif reserved and new["metadata"].get("deletionTimestamp"):
            before = {c.get("uid") for c in old_status.get("reservedFor") or []}
            if any(c.get("uid") not in before for c in reserved):
                causes.append(("status.reservedFor", "Forbidden: new entries may not be added while "
                               "`deallocationRequested` or `deletionTimestamp` are set"))
        allocation, old_allocation = status.get("allocation"), old_status.get("allocation")
        if old_allocation and allocation and (normal_new.get("status") or {}).get("allocation") != (
                normal_old.get("status") or {}).get("allocation"):
            causes.append(("status.allocation", "Invalid value: field is immutable"))
        elif allocation and not old_allocation:
            requests = {q.get("name") for q in ((new.get("spec") or {}).get("devices") or {}).get("requests") or []}
            for index, result in enumerate((allocation.get("devices") or {}).get("results") or []):
                if str(result.get("request", "")).split("/")[0] not in requests:
                    causes.append((f"status.allocation.devices.results[{index}].request",
                                   f'Invalid value: "{result.get("request")}": must be the name of a request in the '
                                   "claim or the name of a request and a subrequest separated by '/'"))
        if causes:
            raise _invalid(r, name, causes)

    @staticmethod
    def _check_pod_update(r: Resource, old: Object, normal_old: Object, normal_new: Object) -> None:
        """Scheduling gates may only be removed; the rest of the spec may not change (see the docstring)."""
        name = old["metadata"]["name"]
        old_spec = copy.deepcopy(normal_old.get("spec") or {})
        new_spec = copy.deepcopy(normal_new.get("spec") or {})
        old_gates = [g.get("name") for g in old_spec.pop("schedulingGates", None) or []]
        new_gates = [g.get("name") for g in new_spec.pop("schedulingGates", None) or []]
        for gate in new_gates:
            if gate not in old_gates:
                raise _invalid(r, name, [("spec.schedulingGates", "Forbidden: only deletion is allowed, but found new "
                                          f"scheduling gate '{gate}'")])
        if old_spec != new_spec:
            changed = sorted(k for k in set(old_spec) | set(new_spec) if old_spec.get(k) != new_spec.get(k))
            raise _invalid(r, name, [("spec", "Forbidden: pod updates may not change fields other than "
                                      "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                                      "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
                                      "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 "
                                      "if it was previously negative) (the fake allows only removing "
                                      f"spec.schedulingGates; changed: {', '.join(changed)})")])

    def _check_budget(self, pod: Object) -> None:
        namespace = pod["metadata"].get("namespace")
        labels = pod["metadata"].get("labels") or {}
        budgets = [b for b in self.objects[PDBS].values() if b["metadata"].get("namespace") == namespace
                   and selects((b.get("spec") or {}).get("selector"), labels)]
        if not budgets:
            return
        if len(budgets) > 1:
            raise FakeApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
                               "eviction subresource does not support.")
        budget = budgets[0]
        spec = budget.get("spec") or {}
        selected = [p for p in self.objects[PODS].values() if p["metadata"].get("namespace") == namespace
                    and selects(spec.get("selector"), p["metadata"].get("labels") or {})]
        expected = len(selected)
        healthy = sum(1 for p in selected if (p.get("status") or {}).get("phase") == "Running"
                      and not p["metadata"].get("deletionTimestamp"))
        if spec.get("minAvailable") is not None:
            desired = _scaled(spec["minAvailable"], expected)
        elif spec.get("maxUnavailable") is not None:
            desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
        else:
            desired = expected
        if healthy - desired <= 0:
            raise FakeApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption "
                               "budget.", {"causes": [{"reason": "DisruptionBudget", "message": (
                                   f"The disruption budget {budget['metadata']['name']} needs {desired} healthy pods "
                                   f"and has {healthy} currently")}]})

    # the rest of the control plane ---------------------------------------------------------------
    def _settle(self) -> None:
        """Controllers react to every change until nothing more changes (under the lock, so a test sees the
        cluster settled when a write returns)."""
        if self._settling:
            return
        self._settling = True
        try:
            for _ in range(100):
                changed = False
                if self.claim_controller:
                    changed |= self._release_reservations()
                if self.scheduler:
                    changed |= self._schedule()
                if self.kubelet:
                    changed |= self._run_bound_pods()
                if not changed:
                    return
        finally:
            self._settling = False

    def _release_reservations(self) -> bool:
        """The resourceclaim controller: reservedFor loses pods that are gone or finished."""
        changed = False
        for key in sorted(self._reserving):
            claim = self.objects[CLAIMS][key]
            status = claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            keep = [c for c in reserved if c.get("resource") != "pods" or self._pod_holds(claim, c)]
            if len(keep) != len(reserved):
                new = copy.deepcopy(claim)
                if keep:
                    new["status"]["reservedFor"] = keep
                else:
                    new["status"].pop("reservedFor")
                self._commit(CLAIMS, "MODIFIED", new)
                changed = True
        return changed

    def _pod_holds(self, claim: Object, consumer: Object) -> bool:
        pod = self.objects[PODS].get(_key(claim["metadata"].get("namespace"), consumer.get("name", "")))
        return (pod is not None and pod["metadata"].get("uid") == consumer.get("uid")
                and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))

    def _schedule(self) -> bool:
        """kube-scheduler for pods without gates or node: claims allocated -> reserved, pod bound."""
        changed = False
        for key in sorted(self._unbound):
            pod = self.objects[PODS][key]
            metadata = pod["metadata"]
            node, why = self._placement(pod)
            if node is None:
                if self._set_condition(pod, "PodScheduled", "False", "Unschedulable", why):
                    changed = True
                continue
            reference = {"resource": "pods", "name": metadata["name"], "uid": metadata.get("uid")}
            for claim in self._claims_of(pod):
                reserved = (claim.get("status") or {}).get("reservedFor") or []
                if all(c.get("uid") != metadata.get("uid") for c in reserved):
                    new = copy.deepcopy(claim)
                    new["status"]["reservedFor"] = [*reserved, reference]
                    self._commit(CLAIMS, "MODIFIED", new)
            bound = copy.deepcopy(pod)
            bound["spec"]["nodeName"] = node
            _put_condition(bound, "PodScheduled", "True", None, None)
            self._commit(PODS, "MODIFIED", bound)
            changed = True
        return changed

    def _run_bound_pods(self) -> bool:
        """The kubelet: a bound, Pending pod starts Running."""
        changed = False
        for key in sorted(self._starting):
            running = copy.deepcopy(self.objects[PODS][key])
            running.setdefault("status", {})["phase"] = "Running"
            running["status"]["startTime"] = _now()
            _put_condition(running, "Ready", "True", None, None)
            self._commit(PODS, "MODIFIED", running)
            changed = True
        return changed

    def _claims_of(self, pod: Object) -> list[Object]:
        namespace = pod["metadata"].get("namespace")
        names = [c.get("resourceClaimName") for c in (pod.get("spec") or {}).get("resourceClaims") or []]
        return [self.objects[CLAIMS][_key(namespace, n)] for n in names if n and _key(namespace, n)
                in self.objects[CLAIMS]]

    def _placement(self, pod: Object) -> tuple[str | None, str]:
        """The node the pod's allocated claims name, or why the pod cannot be scheduled."""
        namespace = pod["metadata"].get("namespace")
        wanted: set[str] = set()
        for reference in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = reference.get("resourceClaimName")
            if not name:
                return None, "resourceClaimTemplateName is not supported by the fake API server's scheduler"
            claim = self.objects[CLAIMS].get(_key(namespace, name))
            if claim is None:
                return None, f'resourceclaim "{name}" not found'
            if claim["metadata"].get("deletionTimestamp"):
                return None, f'resourceclaim "{name}" is being deleted'
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                return None, f'resourceclaim "{name}" is not allocated (the fake scheduler does not allocate)'
            if (node := allocation_node(allocation)) is not None:
                wanted.add(node)
        if len(wanted) > 1:
            return None, f"the pod's claims are allocated on different nodes: {sorted(wanted)}"
        nodes = sorted(self.objects[NODES])
        if wanted:
            node = wanted.pop()
            return (node, "") if node in self.objects[NODES] else (None, f'node "{node}" not found')
        return (nodes[0], "") if nodes else (None, "0/0 nodes are available")

    def _set_condition(self, pod: Object, kind: str, status: str, reason: str | None, message: str | None) -> bool:
        new = copy.deepcopy(pod)
        if not _put_condition(new, kind, status, reason, message):
            return False
        self._commit(PODS, "MODIFIED", new)
        return True


def allocation_node(allocation: Object) -> str | None:
    """The node an allocation's nodeSelector names (matchFields metadata.name, or the hostname label)."""
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for requirement in (term.get("matchFields") or []) + (term.get("matchExpressions") or []):
            if requirement.get("key") in ("metadata.name", "kubernetes.io/hostname") and requirement.get(
                    "operator") == "In" and requirement.get("values"):
                return str(requirement["values"][0])
    return None


def _put_condition(obj: Object, kind: str, status: str, reason: str | None, message: str | None) -> bool:
    """Sets a status condition; False when it was already so."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    wanted = {"type": kind, "status": status, **({"reason": reason} if reason else {}),
              **({"message": message} if message else {})}
    for index, condition in enumerate(conditions):
        if condition.get("type") == kind:
            if all(condition.get(k) == wanted.get(k) for k in ("status", "reason", "message")):
                return False
            conditions[index] = {**wanted, "lastTransitionTime": _now()}
            return True
    conditions.append({**wanted, "lastTransitionTime": _now()})
    return True


def _scaled(value: int | str, total: int) -> int:
    """An int-or-percent of `total`, rounded up, as the disruption controller scales it."""
    if isinstance(value, str) and value.endswith("%"):
        return -(-int(value[:-1]) * total // 100)
    return int(value)


def _validation_text(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return f"{error.title}: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(object)'}: {e['msg']}" for e in error.errors())
    return str(error)


def _unknown_fields(given: Any, kept: Any, path: str = "") -> list[str]:
    """Paths present in the body that the model dropped."""
    found: list[str] = []
    if isinstance(given, dict) and isinstance(kept, dict):
        for key, value in given.items():
            child = f"{path}.{key}" if path else key
            if key not in kept:
                if value is not None:
                    found.append(child)
            else:
                found += _unknown_fields(value, kept[key], child)
    elif isinstance(given, list) and isinstance(kept, list):
        for index, (value, kept_value) in enumerate(zip(given, kept, strict=False)):
            found += _unknown_fields(value, kept_value, f"{path}[{index}]")
    return found


# patches -------------------------------------------------------------------------------------------
class PatchError(FakeApiError):
    def __init__(self, message: str) -> None:
        super().__init__(422, "Invalid", message)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _resolve(document: Any, tokens: list[str], path: str) -> Any:
    for token in tokens:
        if isinstance(document, dict) and token in document:
            document = document[token]
        elif isinstance(document, list) and token.isdigit() and int(token) < len(document):
            document = document[int(token)]
        else:
            raise PatchError(f"jsonpatch: the path {path!r} does not exist")
    return document


def json_patch(document: Any, operations: list[Any]) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, move, copy, test."""
    document = copy.deepcopy(document)

    def add(tokens: list[str], value: Any, path: str) -> None:
        nonlocal document
        if not tokens:
            document = value
            return
        parent = _resolve(document, tokens[:-1], path)
        last = tokens[-1]
        if isinstance(parent, dict):
            parent[last] = value
        elif isinstance(parent, list) and (last == "-" or last.isdigit() and int(last) <= len(parent)):
            parent.insert(len(parent) if last == "-" else int(last), value)
        else:
            raise PatchError(f"jsonpatch add operation does not apply: doc is missing path: {path!r}")

    def remove(tokens: list[str], path: str) -> Any:
        if not tokens:
            raise PatchError("jsonpatch: cannot remove the whole document")
        parent = _resolve(document, tokens[:-1], path)
        last = tokens[-1]
        if isinstance(parent, dict) and last in parent:
            return parent.pop(last)
        if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
            return parent.pop(int(last))
        raise PatchError(f"jsonpatch remove operation does not apply: doc is missing path: {path!r}")

    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise PatchError(f"jsonpatch: invalid operation {operation!r}")
        op, path = operation["op"], operation["path"]
        tokens = _pointer(path)
        if op == "add":
            add(tokens, copy.deepcopy(operation.get("value")), path)
        elif op == "remove":
            remove(tokens, path)
        elif op == "replace":
            _resolve(document, tokens, path)
            if tokens:
                remove(tokens, path)
            add(tokens, copy.deepcopy(operation.get("value")), path)
        elif op in ("move", "copy"):
            source = _pointer(operation.get("from", ""))
            value = remove(source, operation["from"]) if op == "move" else copy.deepcopy(
                _resolve(document, source, operation.get("from", "")))
            add(tokens, value, path)
        elif op == "test":
            if _resolve(document, tokens, path) != operation.get("value"):
                raise PatchError(f"testing value {path} failed")
        else:
            raise PatchError(f"jsonpatch: unexpected kind of operation {op!r}")
    return document


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge patch, simplified (see the module docstring); None means deleted."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [item for item in result.get(name) or [] if item not in (value or [])]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in PRIMITIVE_MERGE:
            existing = list(result.get(key) or [])
            result[key] = existing + [item for item in value if item not in existing]
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(original: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    result = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, dict):
            return copy.deepcopy(patch)
        index = next((i for i, existing in enumerate(result)
                      if isinstance(existing, dict) and existing.get(merge_key) == item.get(merge_key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


# HTTP --------------------------------------------------------------------------------------------
def handler_for(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms wait for a delayed ACK

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self.serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self.serve("PUT")

        def do_PATCH(self) -> None:  # noqa: N802
            self.serve("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self.serve("DELETE")

        def serve(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            route = ROUTE.match(url.path)
            r = RESOURCES.get(route["plural"]) if route else None
            if route is None or r is None or r.prefix != route["prefix"] or (
                    route["namespace"] and not r.namespaced) or (route["name"] and r.namespaced
                                                                 and not route["namespace"]):
                self.reply(404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                 "message": "the server could not find the requested resource",
                                 "reason": "NotFound", "code": 404})
                return
            namespace, name, subresource = route["namespace"], route["name"], route["subresource"] or ""
            verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete"}[method]
            if verb == "list" and query.get("watch") in ("true", "True", "1"):
                self.watch(r, namespace, query)
                return
            code: int = 500
            body: Object = {}
            warnings: list[str] = []
            try:
                payload = json.loads(raw) if raw else None
                code, body, warnings = self.act(method, r, namespace, name, subresource, query, payload,
                                                content_type)
            except json.JSONDecodeError as error:
                body = _bad_request(f"invalid JSON in the request body: {error}").status()
                code = 400
            except FakeApiError as error:
                code, body = error.code, error.status()
            with api.changed:
                api.requests.append(Request(method, url.path, verb, r.plural, namespace, name, subresource, code,
                                            content_type, tuple(warnings)))
                api.changed.notify_all()
            self.reply(code, body, warnings)

        def act(self, method: str, r: Resource, namespace: str | None, name: str | None, subresource: str,
                query: dict[str, str], payload: Any, content_type: str) -> tuple[int, Object, list[str]]:
            strict = query.get("fieldValidation") == "Strict"
            with api.changed:
                if subresource not in ("", "status", "eviction") or (subresource == "status" and not r.has_status) \
                        or (subresource == "eviction") != (r.plural == PODS and method == "POST" and bool(name)):
                    raise FakeApiError(405 if subresource in ("status", "eviction") else 404,
                                       "MethodNotAllowed" if subresource in ("status", "eviction") else "NotFound",
                                       f"{method} {r.plural}/{subresource} is not supported")
                if method == "GET" and name:
                    return 200, api.read(r.plural, namespace, name), []
                if method == "GET":
                    selector = Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
                    return 200, json.loads(api.list_body(r.plural, namespace, selector)), []
                if method == "POST" and subresource == "eviction" and name and namespace:
                    return 201, api.evict(namespace, name, payload), []
                if method == "POST" and not name and (namespace or not r.namespaced):
                    obj, warnings = api.create_object(r.plural, namespace, payload, strict=strict)
                    return 201, obj, warnings
                if method == "PUT" and name:
                    obj, warnings = api.update_object(r.plural, namespace, name, payload, subresource, strict=strict)
                    return 200, obj, warnings
                if method == "PATCH" and name:
                    obj, warnings = api.patch_object(r.plural, namespace, name, payload, content_type, subresource,
                                                     strict=strict)
                    return 200, obj, warnings
                if method == "DELETE" and name and not subresource:
                    deleted = api.delete_object(r.plural, namespace, name, payload)
                    held = api.get(r.plural, namespace, name) is not None
                    return 202 if held else 200, deleted, []  # 202: accepted, finalizers hold it
            raise FakeApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                               f"resource: {method} {r.plural}")

        def reply(self, code: int, body: Object, warnings: list[str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for warning in warnings or []:
                escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
                self.send_header("Warning", f'299 - "{escaped}"')
            self.end_headers()
            self.wfile.write(data)

        def watch(self, r: Resource, namespace: str | None, query: dict[str, str]) -> None:
            version_text = query.get("resourceVersion", "")
            try:
                selector = Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
                since = int(version_text) if version_text not in ("", "0") else None
            except (FakeApiError, ValueError) as error:
                self.reply(400, _bad_request(str(error)).status())
                return
            with api.changed:
                api.requests.append(Request("GET", self.path.split("?")[0], "watch", r.plural, namespace, None, "",
                                            200))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(event: Object) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            try:
                ending = api.stream(r.plural, since, query.get("allowWatchBookmarks") in ("true", "True", "1"),
                                    float(query.get("timeoutSeconds", "30")), send, namespace=namespace,
                                    selector=selector, version_text=version_text)
                if ending == "drop":  # no terminating chunk: the client sees a broken payload
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:  # the client went away
                self.close_connection = True

    return Handler


@contextmanager
def serving(api: FakeApiServer | None = None) -> Iterator[tuple[FakeApiServer, str]]:
    """The fake on 127.0.0.1 at a random port, one thread per connection, until the block ends."""
    api = api or FakeApiServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(api))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name="fake-kube-api")
    thread.start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield api, api.url
    finally:
        with api.changed:
            api.stopping = True
            api.changed.notify_all()
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake_api() -> Iterator[tuple[FakeApiServer, str]]:
    with serving() as opened:
        yield opened


def write_kubeconfig(path: Path, url: str, *, namespace: str | None = None) -> Path:
    """A kubeconfig whose current context points at `url` (a token the fake does not check)."""
    context: dict[str, Any] = {"cluster": "lab", "user": "broker"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": url}}],
        "users": [{"name": "broker", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "lab", "context": context}],
    }))
    return path


# builders ----------------------------------------------------------------------------------------
def node(name: str, labels: dict[str, str], capacity: dict[str, str]) -> Object:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": "2026-11-30T08:00:00Z",
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", **labels}},
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": f"kind://docker/lab/{name}"},
        "status": {
            "capacity": {"cpu": "96", "memory": "1056375604Ki", "pods": "110", "ephemeral-storage": "1Ti",
                         **capacity},
            "allocatable": {"cpu": "95", "memory": "1056273204Ki", "pods": "110", **capacity},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2026-12-03T07:00:00Z",
                            "lastTransitionTime": "2026-11-30T08:01:00Z"}],
            "nodeInfo": {"kubeletVersion": "v1.34.2", "kernelVersion": "6.8.0-60-generic",
                         "osImage": "Ubuntu 24.04.2 LTS", "containerRuntimeVersion": "containerd://2.1.1",
                         "architecture": "amd64", "operatingSystem": "linux", "machineID": "3f2a9c",
                         "systemUUID": "4c4c4544-0051", "bootID": "9b1e", "kubeProxyVersion": ""},
        },
    }


def gpu(index: int) -> Object:
    """A full GPU as NVIDIA's k8s-dra-driver-gpu publishes it."""
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "addressingMode": {"string": "HMM"},
            "architecture": {"string": "Hopper"},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "driverVersion": {"version": "580.105.8"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + 0x11 * index:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + 0x11 * index:02x}"},
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c1{index:02d}"},
        },
        "capacity": {"memory": {"value": "81559Mi"}},
    }


def driver_slice(node_name: str, devices: int, generation: int = 1) -> Object:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node_name}-gpu.nvidia.com-x7k2p", "generateName": f"{node_name}-gpu.nvidia.com-",
            "uid": f"slice-{node_name}", "creationTimestamp": "2026-11-30T08:02:00Z", "generation": generation,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": f"uid-{node_name}",
                                 "controller": True}],
        },
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node_name,
                 "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                 "devices": [gpu(i) for i in range(devices)]},
    }


GFD = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
       "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "4", "nvidia.com/mig.strategy": "none",
       "nvidia.com/gpu.family": "hopper"}


def resource_claim(name: str, namespace: str = "default", *, count: int = 1, device_class: str = "gpu.nvidia.com",
                   request: str = "gpu", broker: bool = True, annotations: dict[str, str] | None = None) -> Object:
    """A ResourceClaim asking for `count` devices of a class, annotated for the broker unless broker=False."""
    notes = {**({"claimbroker.io/broker": "true"} if broker else {}), **(annotations or {})}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, **({"annotations": notes} if notes else {})},
            "spec": {"devices": {"requests": [{"name": request, "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}}]}}}


def allocation(node_name: str, devices: list[str], *, request: str = "gpu", driver: str = "gpu.nvidia.com",
               pool: str | None = None) -> Object:
    """status.allocation of a claim: the devices of one pool, and the nodeSelector naming the node."""
    return {"devices": {"results": [{"request": request, "driver": driver, "pool": pool or node_name, "device": d}
                                    for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}


def pod(name: str, namespace: str = "default", *, claims: tuple[str, ...] = (), gates: tuple[str, ...] = (GATE,),
        labels: dict[str, str] | None = None, node_name: str | None = None) -> Object:
    """A pod whose one container uses `claims` (ResourceClaims by name), held by `gates`."""
    spec: Object = {"containers": [{"name": "main", "image": "registry.example/train:1",
                                    **({"resources": {"claims": [{"name": c} for c in claims]}} if claims else {})}]}
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, **({"labels": labels} if labels else {})},
            "spec": spec}


def disruption_budget(name: str, namespace: str, match_labels: dict[str, str], *,
                      min_available: int | str | None = None, max_unavailable: int | str | None = None) -> Object:
    spec: Object = {"selector": {"matchLabels": match_labels}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


__all__ = ["CLAIMS", "EVENTS", "GATE", "GFD", "JSON_PATCH", "MERGE_PATCH", "NODES", "PDBS", "PODS", "SLICES",
           "STRATEGIC_PATCH", "FakeApiError", "FakeApiServer", "Request", "allocation", "allocation_node",
           "disruption_budget", "driver_slice", "fake_api", "gpu", "handler_for", "node", "pod", "resource_claim",
           "serving", "write_kubeconfig"]
