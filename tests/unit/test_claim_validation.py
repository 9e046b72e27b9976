"""A tenant's claim is checked as the Kubernetes API server checks a resource.k8s.io/v1 ResourceClaim, and
for what the ledger can store, before anything is written: one row per case.

Each refused row names the field path its message must carry, and whether the InvalidClaim keeps the claim's
name (a Rejected status is written under it) or not (the name itself is unusable). Each accepted row is a
claim Kubernetes takes, or that the contract says the broker takes.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.allocator.claim_batch import claim_values
from shared.dra import model as dra
from shared.dra.cel_static import static_problems
from shared.dra.claims import INT32_MAX, INT32_MIN, InvalidClaim, read_submission, settings_of

TENANT = "t1"
GPU = "gpu.nvidia.com"
WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"
SELECTOR = 'device.attributes["gpu.nvidia.com"].productName == "H100"'
PARAMETERS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}


def claim(**metadata: Any) -> dict[str, Any]:
    """One request for one GPU, named "claim"; metadata fields given here replace the defaults."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "claim", **metadata},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}}}


def with_(path: str, value: Any, document: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of `document` (default: `claim()`) with the dotted `path` set; digits index lists."""
    out = copy.deepcopy(document if document is not None else claim())
    target: Any = out
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target.setdefault(key, {})
    target[keys[-1]] = value
    return out


def exact(name: str = "gpu", **body: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": GPU, **body}}


def sub(name: str, **body: Any) -> dict[str, Any]:
    return {"name": name, "deviceClassName": GPU, **body}


def first_available(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": list(subs)}


def requests(*items: dict[str, Any], document: dict[str, Any] | None = None) -> dict[str, Any]:
    return with_("spec.devices.requests", list(items), document)


def constraints(*items: dict[str, Any]) -> dict[str, Any]:
    return with_("spec.devices.constraints", list(items))


def config(*items: dict[str, Any], document: dict[str, Any] | None = None) -> dict[str, Any]:
    return with_("spec.devices.config", list(items), document)


def opaque(*request_names: str, driver: str = GPU, parameters: Any = PARAMETERS) -> dict[str, Any]:
    body: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    return {"requests": list(request_names), **body} if request_names else body


def annotated(key: str, value: Any) -> dict[str, Any]:
    return claim(annotations={key: value})


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def tolerating(**toleration: Any) -> dict[str, Any]:
    return requests(exact(tolerations=[toleration]))


def selecting(expression: str) -> dict[str, Any]:
    return requests(exact(selectors=[{"cel": {"expression": expression}}]))


def owner(**fields: Any) -> dict[str, Any]:
    """An ownerReference as a cluster writes it; fields given here replace the defaults."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "d9607e19-f88f-11e6-a518-42010a800195",
            **fields}


def managed(**fields: Any) -> dict[str, Any]:
    """A managedFields entry as a cluster writes it; fields given here replace the defaults."""
    return {"manager": "kubectl-create", "operation": "Update", "apiVersion": "resource.k8s.io/v1",
            "time": "2026-01-02T15:04:05Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:devices": {".": {}, "f:requests": {}}}}, **fields}


R0 = "spec.devices.requests[0]"
EXACT = f"{R0}.exactly"
PRIORITY = "metadata.annotations[claimbroker.io/priority]"
PREEMPTIBLE = "metadata.annotations[claimbroker.io/preemptible]"
KEEPS = "claim"  # the InvalidClaim keeps the claim's name
NO_NAME = None  # no name could be read: none, not a string, or the subject was refused first


# (id, document, tenant, field path the message names, InvalidClaim.name)
REFUSED: list[tuple[str, Any, str, str, str | None]] = [
    # metadata.name: a DNS subdomain (Kubernetes); the name as written is kept, for the caller to answer
    # under it where a subject can carry it (shared.contract.subjects.carries), else with an alert
    ("name-upper", claim(name="UPPER"), TENANT, "metadata.name", "UPPER"),
    ("name-underscore", claim(name="under_score"), TENANT, "metadata.name", "under_score"),
    ("name-leading-hyphen", claim(name="-leading"), TENANT, "metadata.name", "-leading"),
    ("name-trailing-hyphen", claim(name="trailing-"), TENANT, "metadata.name", "trailing-"),
    ("name-empty-label", claim(name="a..b"), TENANT, "metadata.name", "a..b"),
    ("name-254", claim(name="n" * 254), TENANT, "metadata.name", "n" * 254),
    ("name-space", claim(name="a b"), TENANT, "metadata.name", "a b"),
    ("name-empty", claim(name=""), TENANT, "metadata.name", NO_NAME),
    ("name-missing", with_("metadata", {}), TENANT, "metadata.name", NO_NAME),
    ("name-number", claim(name=5), TENANT, "metadata.name", NO_NAME),
    ("name-nul", claim(name="nul\x00name"), TENANT, "metadata.name", "nul\x00name"),
    ("name-surrogate", claim(name="a\udc00"), TENANT, "metadata.name", "a\udc00"),
    # metadata.namespace is the tenant: a DNS label, the subject's
    ("namespace-other-tenant", claim(namespace="t2"), TENANT, "metadata.namespace", KEEPS),
    ("namespace-upper", claim(namespace="T1"), TENANT, "metadata.namespace", KEEPS),
    ("namespace-nul", claim(namespace="t1\x00"), TENANT, "metadata.namespace", KEEPS),
    ("namespace-number", claim(namespace=7), TENANT, "metadata.namespace", KEEPS),
    ("tenant-upper", claim(), "Team", "subject", NO_NAME),
    ("tenant-underscore", claim(), "t_1", "subject", NO_NAME),
    ("tenant-64", claim(), "t" * 64, "subject", NO_NAME),
    # request and subrequest names: DNS labels, unique
    ("request-name-upper", requests(exact("GPU")), TENANT, f"{R0}.name", KEEPS),
    ("request-name-64", requests(exact("g" * 64)), TENANT, f"{R0}.name", KEEPS),
    ("request-name-underscore", requests(exact("g_pu")), TENANT, f"{R0}.name", KEEPS),
    ("request-name-dot", requests(exact("g.pu")), TENANT, f"{R0}.name", KEEPS),
    ("request-name-empty", requests(exact("")), TENANT, f"{R0}.name", KEEPS),
    ("request-name-newline", requests(exact("gpu\n")), TENANT, f"{R0}.name", KEEPS),
    ("request-name-nul", requests(exact("g\x00pu")), TENANT, f"{R0}.name", KEEPS),
    ("request-duplicate", requests(exact("gpu"), exact("gpu")), TENANT, "spec.devices.requests[1].name", KEEPS),
    ("subrequest-name-upper", requests(first_available("gpu", sub("ONE"))), TENANT,
     f"{R0}.firstAvailable[0].name", KEEPS),
    ("subrequest-name-64", requests(first_available("gpu", sub("s" * 64))), TENANT,
     f"{R0}.firstAvailable[0].name", KEEPS),
    ("subrequest-duplicate", requests(first_available("gpu", sub("a"), sub("a"))), TENANT,
     f"{R0}.firstAvailable[1].name", KEEPS),
    # exactly one of exactly / firstAvailable, and firstAvailable's size
    ("request-neither", requests({"name": "gpu"}), TENANT, R0, KEEPS),
    ("request-both", requests(exact() | {"firstAvailable": [sub("one")]}), TENANT, R0, KEEPS),
    ("first-available-empty", requests(first_available("gpu")), TENANT, R0, KEEPS),
    ("first-available-9", requests(first_available("gpu", *[sub(f"s{i}") for i in range(9)])), TENANT,
     f"{R0}.firstAvailable", KEEPS),
    ("first-available-all-over-32", requests(first_available("gpu", sub("a", count=33), sub("b", count=64))),
     TENANT, f"{R0}.firstAvailable", KEEPS),
    ("subrequest-admin-access", requests(first_available("gpu", sub("one", adminAccess=True))), TENANT,
     f"{R0}.firstAvailable[0].adminAccess", KEEPS),
    # count: a strict integer, > 0, at most 32 devices per claim, unset with All
    ("count-string", requests(exact(count="1")), TENANT, f"{EXACT}.count", KEEPS),
    ("count-true", requests(exact(count=True)), TENANT, f"{EXACT}.count", KEEPS),
    ("count-float", requests(exact(count=1.0)), TENANT, f"{EXACT}.count", KEEPS),
    ("count-list", requests(exact(count=[1])), TENANT, f"{EXACT}.count", KEEPS),
    ("count-minus-one", requests(exact(count=-1)), TENANT, f"{EXACT}.count", KEEPS),
    ("count-33", requests(exact(count=33)), TENANT, f"{EXACT}.count", KEEPS),
    ("count-1e9", requests(exact(count=10**9)), TENANT, f"{EXACT}.count", KEEPS),
    ("count-2-63", requests(exact(count=2**63)), TENANT, f"{EXACT}.count", KEEPS),
    ("count-with-all", requests(exact(allocationMode="All", count=2)), TENANT, f"{EXACT}.count", KEEPS),
    ("subrequest-count-string", requests(first_available("gpu", sub("one", count="1"))), TENANT,
     f"{R0}.firstAvailable[0].count", KEEPS),
    # enums and strict booleans
    ("mode-some", requests(exact(allocationMode="Some")), TENANT, f"{EXACT}.allocationMode", KEEPS),
    ("mode-lowercase", requests(exact(allocationMode="all")), TENANT, f"{EXACT}.allocationMode", KEEPS),
    ("admin-access-yes", requests(exact(adminAccess="yes")), TENANT, f"{EXACT}.adminAccess", KEEPS),
    ("admin-access-string-true", requests(exact(adminAccess="true")), TENANT, f"{EXACT}.adminAccess", KEEPS),
    ("admin-access-one", requests(exact(adminAccess=1)), TENANT, f"{EXACT}.adminAccess", KEEPS),
    ("toleration-operator", tolerating(key="a", operator="Maybe"), TENANT, f"{EXACT}.tolerations[0].operator", KEEPS),
    ("toleration-effect", tolerating(operator="Exists", effect="Sometimes"), TENANT,
     f"{EXACT}.tolerations[0].effect", KEEPS),
    ("toleration-exists-with-value", tolerating(key="a", operator="Exists", value="x"), TENANT,
     f"{EXACT}.tolerations[0].value", KEEPS),
    ("toleration-key", tolerating(key="not a key", operator="Exists"), TENANT, f"{EXACT}.tolerations[0].key", KEEPS),
    ("toleration-value", tolerating(key="a", value="not a value!"), TENANT, f"{EXACT}.tolerations[0].value", KEEPS),
    ("toleration-seconds-string", tolerating(operator="Exists", tolerationSeconds="5"), TENANT,
     f"{EXACT}.tolerations[0].tolerationSeconds", KEEPS),
    # device class names
    ("class-empty", requests(exact(deviceClassName="")), TENANT, f"{EXACT}.deviceClassName", KEEPS),
    ("class-300", requests(exact(deviceClassName="c" * 300)), TENANT, f"{EXACT}.deviceClassName", KEEPS),
    ("class-underscore", requests(exact(deviceClassName="gpu_class")), TENANT, f"{EXACT}.deviceClassName", KEEPS),
    ("class-nul", requests(exact(deviceClassName="gpu.nvidia.com\x00")), TENANT, f"{EXACT}.deviceClassName", KEEPS),
    # capacity requests: qualified names and quantities
    ("capacity-not-a-quantity", requests(exact(capacity={"requests": {"memory": "lots"}})), TENANT,
     f"{EXACT}.capacity.requests[memory]", KEEPS),
    ("capacity-key", requests(exact(capacity={"requests": {"a/b/c": "1"}})), TENANT, f"{EXACT}.capacity.requests",
     KEEPS),
    # references from constraints and config: known requests, "<request>/<subrequest>", each once
    ("config-unknown-request", config(opaque("nope")), TENANT, "spec.devices.config[0].requests[0]", KEEPS),
    ("config-unknown-subrequest",
     config(opaque("gpu/nope"), document=requests(first_available("gpu", sub("one")))), TENANT,
     "spec.devices.config[0].requests[0]", KEEPS),
    ("config-subrequest-of-exactly", config(opaque("gpu/one")), TENANT, "spec.devices.config[0].requests[0]", KEEPS),
    ("config-three-segments", config(opaque("gpu/one/two")), TENANT, "spec.devices.config[0].requests[0]", KEEPS),
    ("config-empty-subrequest", config(opaque("gpu/"), document=requests(first_available("gpu", sub("one")))),
     TENANT, "spec.devices.config[0].requests[0]", KEEPS),
    ("constraint-empty-subrequest", with_("spec.devices.constraints", [
        {"requests": ["gpu/"], "matchAttribute": f"{GPU}/numa-node"}]), TENANT,
     "spec.devices.constraints[0].requests[0]", KEEPS),
    ("config-duplicate-reference", config(opaque("gpu", "gpu")), TENANT, "spec.devices.config[0].requests[1]",
     KEEPS),
    ("config-no-parameters", config({"opaque": {"driver": GPU}}), TENANT, "spec.devices.config[0].opaque.parameters",
     KEEPS),
    ("config-parameters-list", config(opaque(parameters=[1])), TENANT, "spec.devices.config[0].opaque.parameters",
     KEEPS),
    ("config-parameters-over-10ki", config(opaque(parameters={"pad": "x" * 10_240})), TENANT,
     "spec.devices.config[0].opaque.parameters", KEEPS),
    ("config-parameters-too-deep", config(opaque(parameters={"deep": nested(300)})), TENANT,
     "spec.devices.config[0].opaque.parameters.deep", KEEPS),
    ("config-driver-empty", config(opaque(driver="")), TENANT, "spec.devices.config[0].opaque.driver", KEEPS),
    ("config-driver-64", config(opaque(driver="d" * 64)), TENANT, "spec.devices.config[0].opaque.driver", KEEPS),
    ("config-no-opaque", config({"requests": ["gpu"]}), TENANT, "spec.devices.config[0].opaque", KEEPS),
    ("constraint-unknown-request", constraints({"requests": ["nope"], "matchAttribute": f"{GPU}/numa-node"}),
     TENANT, "spec.devices.constraints[0].requests[0]", KEEPS),
    ("constraint-both", constraints({"matchAttribute": f"{GPU}/numa-node", "distinctAttribute": f"{GPU}/uuid"}),
     TENANT, "spec.devices.constraints[0]", KEEPS),
    ("constraint-neither", constraints({"requests": ["gpu"]}), TENANT, "spec.devices.constraints[0]", KEEPS),
    ("constraint-not-a-name", constraints({"matchAttribute": "not a name!"}), TENANT,
     "spec.devices.constraints[0].matchAttribute", KEEPS),
    ("constraint-no-domain", constraints({"matchAttribute": "numa-node"}), TENANT,
     "spec.devices.constraints[0].matchAttribute", KEEPS),
    ("constraint-name-33", constraints({"distinctAttribute": f"{GPU}/{'a' * 33}"}), TENANT,
     "spec.devices.constraints[0].distinctAttribute", KEEPS),
    # list sizes Kubernetes enforces
    ("requests-33", requests(*[exact(f"r{i}") for i in range(33)]), TENANT, "spec.devices.requests", KEEPS),
    ("constraints-33", constraints(*[{"matchAttribute": f"{GPU}/numa-node"}] * 33), TENANT,
     "spec.devices.constraints", KEEPS),
    ("config-33", config(*[opaque()] * 33), TENANT, "spec.devices.config", KEEPS),
    ("selectors-33", requests(exact(selectors=[{"cel": {"expression": "true"}}] * 33)), TENANT,
     f"{EXACT}.selectors", KEEPS),
    ("tolerations-17", requests(exact(tolerations=[{"operator": "Exists"}] * 17)), TENANT, f"{EXACT}.tolerations",
     KEEPS),
    ("constraint-requests-33", constraints({"requests": [f"r{i}" for i in range(33)],
                                            "matchAttribute": f"{GPU}/numa-node"}), TENANT,
     "spec.devices.constraints[0].requests", KEEPS),
    ("cel-10241-bytes", requests(exact(selectors=[{"cel": {"expression": "x" * 10_241}}])), TENANT,
     f"{EXACT}.selectors[0].cel.expression", KEEPS),
    ("cel-10242-bytes-in-5121-characters",  # the limit is in bytes, as Go's len() counts
     requests(exact(selectors=[{"cel": {"expression": '"' + "é" * 5_120 + '"'}}])), TENANT,
     f"{EXACT}.selectors[0].cel.expression", KEEPS),
    ("selector-no-expression", requests(exact(selectors=[{"cel": {}}])), TENANT,
     f"{EXACT}.selectors[0].cel.expression", KEEPS),
    # kind and apiVersion, and unknown fields (kubectl --validate=strict)
    ("kind-pod", with_("kind", "Pod"), TENANT, "kind", KEEPS),
    ("kind-list", with_("kind", ["ResourceClaim"]), TENANT, "kind", KEEPS),
    ("kind-object", with_("kind", {}), TENANT, "kind", KEEPS),
    ("api-version-v1beta1", with_("apiVersion", "resource.k8s.io/v1beta1"), TENANT, "apiVersion", KEEPS),
    ("unknown-field", requests(exact(colour="red")), TENANT, f"{EXACT}.colour", KEEPS),
    # the broker's annotations: ASCII digits that fit the 32-bit column, "true" or "false"
    ("priority-arabic-indic", annotated("claimbroker.io/priority", "٣"), TENANT, PRIORITY, KEEPS),
    ("priority-fullwidth", annotated("claimbroker.io/priority", "５"), TENANT, PRIORITY, KEEPS),
    ("priority-underscore", annotated("claimbroker.io/priority", "1_000"), TENANT, PRIORITY, KEEPS),
    ("priority-spaces", annotated("claimbroker.io/priority", " 5 "), TENANT, PRIORITY, KEEPS),
    ("priority-newline", annotated("claimbroker.io/priority", "5\n"), TENANT, PRIORITY, KEEPS),
    ("priority-plus", annotated("claimbroker.io/priority", "+5"), TENANT, PRIORITY, KEEPS),
    ("priority-float", annotated("claimbroker.io/priority", "5.0"), TENANT, PRIORITY, KEEPS),
    ("priority-hex", annotated("claimbroker.io/priority", "0x10"), TENANT, PRIORITY, KEEPS),
    ("priority-empty", annotated("claimbroker.io/priority", ""), TENANT, PRIORITY, KEEPS),
    ("priority-2147483648", annotated("claimbroker.io/priority", "2147483648"), TENANT, PRIORITY, KEEPS),
    ("priority-minus-2147483649", annotated("claimbroker.io/priority", "-2147483649"), TENANT, PRIORITY, KEEPS),
    ("priority-400-digits", annotated("claimbroker.io/priority", "1" + "0" * 400), TENANT, PRIORITY, KEEPS),
    ("priority-number", annotated("claimbroker.io/priority", 5), TENANT, PRIORITY, KEEPS),
    ("preemptible-yes", annotated("claimbroker.io/preemptible", "yes"), TENANT, PREEMPTIBLE, KEEPS),
    ("preemptible-maybe", annotated("claimbroker.io/preemptible", "maybe"), TENANT, PREEMPTIBLE, KEEPS),
    ("preemptible-empty", annotated("claimbroker.io/preemptible", ""), TENANT, PREEMPTIBLE, KEEPS),
    ("preemptible-padded", annotated("claimbroker.io/preemptible", " true"), TENANT, PREEMPTIBLE, KEEPS),
    # annotations and labels as ObjectMeta validation has them
    ("annotation-key", annotated("not a key", "x"), TENANT, "metadata.annotations", KEEPS),
    ("annotation-key-two-slashes", annotated("a/b/c", "x"), TENANT, "metadata.annotations", KEEPS),
    ("annotations-over-256ki", annotated("pad", "x" * (256 * 1024)), TENANT, "metadata.annotations", KEEPS),
    ("label-key", claim(labels={"bad key": "x"}), TENANT, "metadata.labels", KEEPS),
    ("label-value", claim(labels={"app": "not ok!"}), TENANT, "metadata.labels[app]", KEEPS),
    ("label-value-64", claim(labels={"app": "v" * 64}), TENANT, "metadata.labels[app]", KEEPS),
    # what PostgreSQL (NUL) or UTF-8 (lone surrogates) cannot store
    ("annotation-nul", annotated("note", "a\x00b"), TENANT, "metadata.annotations[note]", KEEPS),
    ("annotation-surrogate", annotated("note", "\ud800"), TENANT, "metadata.annotations[note]", KEEPS),
    ("annotation-key-nul", annotated("no\x00te", "x"), TENANT, "metadata.annotations", KEEPS),
    ("selector-nul", requests(exact(selectors=[{"cel": {"expression": "true\x00"}}])), TENANT,
     f"{EXACT}.selectors[0].cel.expression", KEEPS),
    # ObjectMeta's other fields (apimachinery ValidateObjectMetaAccessor, core validateKubeFinalizerName) and
    # what the API server refuses only on create (storage: "resourceVersion should not be set ...")
    ("resource-version", claim(resourceVersion="17"), TENANT, "metadata.resourceVersion", KEEPS),
    ("generate-name", claim(generateName="Train_"), TENANT, "metadata.generateName", KEEPS),
    ("generate-name-only", with_("metadata", {"generateName": "train-"}), TENANT, "metadata.name", NO_NAME),
    ("generation-negative", claim(generation=-1), TENANT, "metadata.generation", KEEPS),
    ("generation-string", claim(generation="1"), TENANT, "metadata.generation", KEEPS),
    ("creation-timestamp-word", claim(creationTimestamp="yesterday"), TENANT, "metadata.creationTimestamp", KEEPS),
    ("creation-timestamp-date-only", claim(creationTimestamp="2026-01-02"), TENANT, "metadata.creationTimestamp",
     KEEPS),
    ("deletion-timestamp-month-13", claim(deletionTimestamp="2026-13-01T00:00:00Z"), TENANT,
     "metadata.deletionTimestamp", KEEPS),
    ("deletion-grace-string", claim(deletionGracePeriodSeconds="30"), TENANT, "metadata.deletionGracePeriodSeconds",
     KEEPS),
    ("uid-number", claim(uid=5), TENANT, "metadata.uid", KEEPS),
    ("finalizer-unqualified", claim(finalizers=["my-finalizer"]), TENANT, "metadata.finalizers[0]", KEEPS),
    ("finalizer-bad-name", claim(finalizers=["example.com/bad name"]), TENANT, "metadata.finalizers[0]", KEEPS),
    ("finalizers-orphan-and-foreground", claim(finalizers=["orphan", "foregroundDeletion"]), TENANT,
     "metadata.finalizers", KEEPS),
    ("finalizers-string", claim(finalizers="orphan"), TENANT, "metadata.finalizers", KEEPS),
    ("owner-reference-empty", claim(ownerReferences=[{}]), TENANT, "metadata.ownerReferences[0].apiVersion", KEEPS),
    ("owner-reference-no-uid", claim(ownerReferences=[owner(uid="")]), TENANT, "metadata.ownerReferences[0].uid",
     KEEPS),
    ("owner-reference-no-version", claim(ownerReferences=[owner(apiVersion="batch/")]), TENANT,
     "metadata.ownerReferences[0].apiVersion", KEEPS),
    ("owner-reference-event", claim(ownerReferences=[owner(apiVersion="v1", kind="Event")]), TENANT,
     "metadata.ownerReferences[0]", KEEPS),
    ("owner-references-two-controllers", claim(ownerReferences=[owner(controller=True),
                                                                owner(name="b", uid="u-2", controller=True)]),
     TENANT, "metadata.ownerReferences", KEEPS),
    ("owner-reference-controller-string", claim(ownerReferences=[owner(controller="true")]), TENANT,
     "metadata.ownerReferences[0].controller", KEEPS),
    ("owner-reference-unknown-field", claim(ownerReferences=[owner(colour="red")]), TENANT,
     "metadata.ownerReferences[0].colour", KEEPS),
    ("managed-fields-operation", claim(managedFields=[managed(operation="Patch")]), TENANT,
     "metadata.managedFields[0].operation", KEEPS),
    ("managed-fields-no-operation", claim(managedFields=[{"manager": "kubectl"}]), TENANT,
     "metadata.managedFields[0].operation", KEEPS),
    ("managed-fields-type", claim(managedFields=[managed(fieldsType="FieldsV2")]), TENANT,
     "metadata.managedFields[0].fieldsType", KEEPS),
    ("managed-fields-manager-129", claim(managedFields=[managed(manager="m" * 129)]), TENANT,
     "metadata.managedFields[0].manager", KEEPS),
    ("managed-fields-time", claim(managedFields=[managed(time="now")]), TENANT, "metadata.managedFields[0].time",
     KEEPS),
    ("metadata-unknown-field", claim(colour="red"), TENANT, "metadata.colour", KEEPS),
    ("metadata-cluster-name", claim(clusterName="c1"), TENANT, "metadata.clusterName", KEEPS),  # gone since 1.25
    # status: dropped on create, but it must still decode as a ResourceClaimStatus
    ("status-string", with_("status", "Allocated"), TENANT, "status", KEEPS),
    ("status-unknown-field", with_("status", {"phase": "Bound"}), TENANT, "status.phase", KEEPS),
    ("status-allocation-list", with_("status", {"allocation": []}), TENANT, "status.allocation", KEEPS),
    # CEL that Kubernetes' DRA compiler refuses for naming what it does not declare, wherever it sits
    ("cel-undeclared-variable", selecting('device.driver == "gpu.nvidia.com" || gpu.ready'), TENANT,
     f"{EXACT}.selectors[0].cel.expression", KEEPS),
    ("cel-undeclared-function", selecting('true || nosuch(1) == 1'), TENANT, f"{EXACT}.selectors[0].cel.expression",
     KEEPS),
    ("cel-undefined-device-field", selecting('true || device.model == "H100"'), TENANT,
     f"{EXACT}.selectors[0].cel.expression", KEEPS),
    ("cel-undeclared-in-subrequest",
     requests(first_available("gpu", sub("one", selectors=[{"cel": {"expression": "false && x"}}]))), TENANT,
     f"{R0}.firstAvailable[0].selectors[0].cel.expression", KEEPS),
]


@pytest.mark.parametrize(("document", "tenant", "path", "name"),
                         [pytest.param(*row[1:], id=row[0]) for row in REFUSED])
def test_refused_with_the_field_path(document: Any, tenant: str, path: str, name: str | None) -> None:
    with pytest.raises(InvalidClaim) as caught:
        read_submission(json.dumps(document).encode(), tenant)
    message = str(caught.value)
    assert f"{path}: " in message, message
    assert caught.value.name == name, message
    assert dra.text_problem(message) is None, "the reason is stored and published: no NUL, no lone surrogate"
    assert len(message) < 4_000, f"a {len(message):,}-character reason"


def test_a_dotted_claim_name_is_read_as_kubernetes_reads_it() -> None:
    """`train.v2` is a valid object name; its status subject writes the '.' as '_' (shared.contract.subjects)."""
    assert read_submission(json.dumps(claim(name="train.v2")).encode(), TENANT).metadata.name == "train.v2"


def test_a_refused_name_names_kubernetes_rule() -> None:
    with pytest.raises(InvalidClaim, match="must be a DNS subdomain .* as Kubernetes requires of an object's name"):
        read_submission(json.dumps(claim(name="UpperCase")).encode(), TENANT)


def test_a_count_over_the_limit_names_the_limit() -> None:
    with pytest.raises(InvalidClaim, match=f"over the claim limit of {dra.MAX_DEVICES_PER_CLAIM} devices"):
        read_submission(json.dumps(requests(exact(count=10**9))).encode(), TENANT)


def test_a_bad_namespace_is_refused_when_parsed_without_a_subject() -> None:
    """`simulate` parses claims without a subject: the namespace rule still holds."""
    with pytest.raises(dra.DocumentError, match=r"metadata\.namespace: \"Team\" must be a DNS label"):
        dra.parse_claim(claim(namespace="Team"))


def test_every_problem_is_named_at_once() -> None:
    document = requests(exact("GPU", count=-1), exact("gpu", deviceClassName=""))
    with pytest.raises(InvalidClaim) as caught:
        read_submission(json.dumps(document).encode(), TENANT)
    assert str(caught.value) == (
        'spec.devices.requests[0].name: "GPU" must be a DNS label (lowercase letters, digits and \'-\', at most 63 '
        "characters); spec.devices.requests[0].exactly.count: must be greater than zero; "
        "spec.devices.requests[1].exactly.deviceClassName: is required")


def _workload_claims() -> list[Any]:
    out = []
    for path in sorted(WORKLOADS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "ResourceClaim":
                out.append(pytest.param(document, id=f"{path.stem}-{document['metadata']['name']}"))
    return out


@pytest.mark.parametrize("document", _workload_claims())
def test_the_lab_and_showcase_claims_still_parse(document: dict[str, Any]) -> None:
    claim_read = read_submission(json.dumps(document).encode(), TENANT)
    assert claim_read.metadata.name == document["metadata"]["name"]


# (id, document, what must hold of the claim read)
ACCEPTED: list[tuple[str, dict[str, Any], Any]] = [
    ("hyphen-in-attribute-name", constraints({"matchAttribute": f"{GPU}/numa-node"}),
     lambda c: c.spec.devices.constraints[0].match_attribute == f"{GPU}/numa-node"),
    ("count-null-defaults-to-1", requests(exact(count=None)), lambda c: c.spec.devices.requests[0].exactly.wanted == 1),
    ("count-0-defaults-to-1", requests(exact(count=0)), lambda c: c.spec.devices.requests[0].exactly.wanted == 1),
    ("count-32", requests(exact(count=32)), lambda c: c.spec.devices.requests[0].exactly.wanted == 32),
    ("mode-empty-is-exact-count", requests(exact(allocationMode="")),
     lambda c: c.spec.devices.requests[0].exactly.allocation_mode == "ExactCount"),
    ("mode-all-count-0", requests(exact(allocationMode="All", count=0)),
     lambda c: c.spec.devices.requests[0].exactly.allocation_mode == "All"),
    ("admin-access-false", requests(exact(adminAccess=False)), lambda c: True),
    ("name-253", claim(name="n" * 253), lambda c: len(c.metadata.name) == 253),
    ("request-name-63", requests(exact("g" * 63)), lambda c: True),
    ("subrequest-over-32-with-a-fallback", requests(first_available("gpu", sub("all", count=64), sub("one"))),
     lambda c: True),
    ("config-for-a-subrequest", config(opaque("gpu/one"), document=requests(first_available("gpu", sub("one")))),
     lambda c: c.spec.devices.config[0].requests == ("gpu/one",)),
    ("config-for-every-request", config(opaque()), lambda c: c.spec.devices.config[0].requests == ()),
    ("constraint-on-a-subrequest", with_("spec.devices.constraints", [
        {"requests": ["gpu/one"], "matchAttribute": f"{GPU}/numa-node"}],
        requests(first_available("gpu", sub("one", count=2)))), lambda c: True),
    ("parameters-200-deep", config(opaque(parameters={"deep": nested(200)})), lambda c: True),
    ("toleration-defaults", tolerating(key="example.com/maintenance"),
     lambda c: c.spec.devices.requests[0].exactly.tolerations[0].operator == "Equal"),
    ("toleration-effect-none", tolerating(operator="Exists", effect="None"), lambda c: True),
    ("capacity-quantity", requests(exact(capacity={"requests": {f"{GPU}/memory": "40Gi", "cores": "500m"}})),
     lambda c: True),
    ("selector-10240-bytes", selecting('device.driver != "' + "x" * (10_240 - 19) + '"'), lambda c: True),
    ("priority-max", annotated("claimbroker.io/priority", str(INT32_MAX)),
     lambda c: settings_of(c).priority == INT32_MAX),
    ("priority-min", annotated("claimbroker.io/priority", str(INT32_MIN)),
     lambda c: settings_of(c).priority == INT32_MIN),
    ("priority-leading-zeros", annotated("claimbroker.io/priority", "00000000000007"),
     lambda c: settings_of(c).priority == 7),
    ("preemptible-any-case", annotated("claimbroker.io/preemptible", "False"),
     lambda c: settings_of(c).preemptible is False),
    ("annotations-under-256ki", annotated("example.com/note", "x" * 200_000), lambda c: True),
    ("labels", claim(labels={"app.kubernetes.io/name": "trainer", "empty": ""}), lambda c: True),
    ("namespace-of-the-tenant", claim(namespace=TENANT), lambda c: c.metadata.namespace == TENANT),
    # ObjectMeta as a cluster writes it: what the API server overwrites on create (uid, timestamps) or keeps
    ("cluster-metadata", claim(uid="0b6c2c4e-f88f-11e6-a518-42010a800195", resourceVersion="", generation=1,
                               creationTimestamp="2026-01-02T15:04:05Z", selfLink="", deletionGracePeriodSeconds=30,
                               ownerReferences=[owner(controller=True, blockOwnerDeletion=True)],
                               finalizers=["claimbroker.io/allocation", "kubernetes"], managedFields=[managed()]),
     lambda c: c.metadata.owner_references[0].kind == "Job"),
    ("resource-version-0", claim(resourceVersion="0"), lambda c: True),  # storage reads 0 as unset
    ("resource-version-not-a-number", claim(resourceVersion="abc"), lambda c: True),  # storage clears it
    ("creation-timestamp-null", claim(creationTimestamp=None), lambda c: True),  # kubectl --dry-run writes it
    ("creation-timestamp-fraction-and-offset", claim(creationTimestamp="2026-01-02T15:04:05.123+02:00"),
     lambda c: True),
    ("generate-name-beside-a-name", claim(generateName="train-"), lambda c: c.metadata.name == "claim"),
    ("managed-fields-reset", claim(managedFields=[{}]), lambda c: True),  # `[{}]` asks the server to reset them
    ("managed-fields-undecodable", claim(managedFields=[managed(operation="Patch", fieldsV1={"bogus": 1})]),
     lambda c: True),  # the field manager replaces entries it cannot decode
    ("labels-null", claim(labels=None), lambda c: c.metadata.labels == {}),
    ("annotation-null-value", annotated("example.com/note", None),  # Go reads null in a map as ""
     lambda c: c.metadata.annotations == {"example.com/note": ""}),
    ("cel-macro-and-bind-variables", selecting('device.attributes["gpu.nvidia.com"].exists(k, k == "productName") && '
                                               'cel.bind(d, device.driver, d == "gpu.nvidia.com") && '
                                               '{"a": 1}.all(k, v, v > 0) && type(1) == int'), lambda c: True),
    ("cel-optional-and-namespaces", selecting('device.attributes["gpu.nvidia.com"].?profile.orValue("") == "" && '
                                              'sets.contains([1], [1]) && optional.of(1).hasValue()'), lambda c: True),
    ("status", with_("status", {"allocation": {"devices": {"results": []}}}), lambda c: True),
    ("non-ascii-annotation-value", annotated("example.com/owner", "Zoë ٣"), lambda c: True),
]


@pytest.mark.parametrize(("document", "holds"), [pytest.param(*row[1:], id=row[0]) for row in ACCEPTED])
def test_accepted_and_storable(document: dict[str, Any], holds: Any) -> None:
    claim_read = read_submission(json.dumps(document).encode(), TENANT)
    assert holds(claim_read)
    row = claim_values(claim_read)  # what the allocator inserts: it must serialise, and fit its columns
    assert len(row["name"]) <= 253 and len(row["namespace"]) <= 63
    assert INT32_MIN <= row["priority"] <= INT32_MAX
    assert dra.ResourceClaim.model_validate(row["spec"]) == claim_read, "the stored claim reads back the same"


def test_a_payload_that_is_not_an_object_is_refused_without_a_name() -> None:
    for payload in (b"[]", b"null", b'"claim"', b"{not json", b"\xff", b"[" * 100_000):
        with pytest.raises(InvalidClaim) as caught:
            read_submission(payload, TENANT)
        assert caught.value.name is None
    with pytest.raises(InvalidClaim, match="metadata"):
        read_submission(json.dumps(with_("metadata", "text")).encode(), TENANT)


def _twice(document: dict[str, Any], once: str, twice: str) -> bytes:
    """The document's JSON with the text `once` replaced by `twice`: a field given two values."""
    text = json.dumps(document)
    assert once in text, once
    return text.replace(once, twice, 1).encode()


# (id, payload, the problem the message names): Kubernetes' strict decoding refuses a field given twice,
# where json.loads would keep the last value
REPEATED: list[tuple[str, bytes, str]] = [
    ("metadata-name", _twice(claim(), '"name": "claim"', '"name": "claim", "name": "other"'),
     'metadata: duplicate field "name"'),
    ("top-level-spec", _twice(claim(), '"spec": ', '"spec": {}, "spec": '), '<document>: duplicate field "spec"'),
    ("request-count", _twice(requests(exact(count=1)), '"count": 1', '"count": 1, "count": 30'),
     f'{EXACT}: duplicate field "count"'),
    ("annotation", _twice(annotated("claimbroker.io/priority", "1"), '"claimbroker.io/priority": "1"',
                          '"claimbroker.io/priority": "1", "claimbroker.io/priority": "100"'),
     'metadata.annotations: duplicate field "claimbroker.io/priority"'),
]


@pytest.mark.parametrize(("payload", "problem"), [pytest.param(*row[1:], id=row[0]) for row in REPEATED])
def test_a_field_given_twice_is_refused(payload: bytes, problem: str) -> None:
    with pytest.raises(InvalidClaim) as caught:
        read_submission(payload, TENANT)
    assert problem in str(caught.value), str(caught.value)
    assert caught.value.name is not None, "the claim's name is readable: its Rejected status says why"


def test_a_field_given_twice_inside_opaque_parameters_is_kept() -> None:
    """Parameters are a RawExtension: the API server stores their bytes and decodes them leniently."""
    document = config(opaque(parameters={"kind": "GpuConfig", "sharing": "TimeSlicing"}))
    payload = _twice(document, '"sharing": "TimeSlicing"', '"sharing": "MPS", "sharing": "TimeSlicing"')
    claim_read = read_submission(payload, TENANT)
    assert claim_read.spec.devices.config[0].opaque.parameters["sharing"] == "TimeSlicing"


def test_a_resource_version_is_refused_only_when_a_claim_is_created() -> None:
    """A claim read back from a cluster has one (the claims-from-a-cluster path parses with on_create=False)."""
    document = with_("metadata.namespace", TENANT, claim(resourceVersion="4711"))
    with pytest.raises(dra.DocumentError, match="metadata.resourceVersion"):
        dra.parse_claim(document)
    assert dra.parse_claim(document, on_create=False).metadata.resource_version == "4711"


def _selectors_kubernetes_accepts() -> list[Any]:
    """Every selector of the built-in classes and of the shipped workloads: none names anything undeclared."""
    from shared.dra.classes import merge_classes
    out = [pytest.param(s.cel.expression, id=f"class-{name}-{i}")
           for name, device_class in merge_classes(()).items() for i, s in enumerate(device_class.spec.selectors)]
    for document in _workload_claims():
        for request in document.values[0]["spec"]["devices"]["requests"]:
            for body in [request.get("exactly") or {}, *request.get("firstAvailable", [])]:
                out += [pytest.param(s["cel"]["expression"], id=f"{document.id}-{request['name']}")
                        for s in body.get("selectors", [])]
    return out


@pytest.mark.parametrize("expression", _selectors_kubernetes_accepts())
def test_shipped_selectors_name_nothing_undeclared(expression: str) -> None:
    assert static_problems(expression) == ()


# (expression, what the message names, or None where Kubernetes compiles it): cel-go's checker and the base
# environment's AST validators refuse these at create time, even in a branch no device ever evaluates
STATIC_CEL: list[tuple[str, str | None]] = [
    ('device.driver == "gpu.nvidia.com" || gpu.ready', "undeclared reference to 'gpu'"),
    ("true || nosuch(1) == 1", "undeclared reference to 'nosuch'"),
    ('true || device.model == "H100"', "undefined field 'model' of device"),
    ('true || [1, "a"] == []', "a list literal's elements mix int and string"),
    ('true || {"a": 1, "b": "x"}.size() == 2', "a map literal's values mix int and string"),
    ("true ? true : 1", "a conditional's branches are bool and int"),
    ('false && device.driver.matches("[")', "invalid regular expression '['"),
    ('false && device.driver.matches("(?=a)")', "invalid perl operator"),
    ('false && device.driver.matches("a{1001}")', "invalid repetition size"),
    ('false && duration("1x") > duration("0")', "duration('1x') is not a duration"),
    ('false && timestamp("yesterday") < timestamp("2026-01-02T15:04:05Z")', "timestamp('yesterday')"),
    ('"H100"', "a selector must evaluate to bool"),
    ("-1", "a selector must evaluate to bool"),
    ('device.attributes["gpu.nvidia.com"].productName.matches("^H1[0-9]{2}$")', None),
    ('device.driver.matches(r"\\pL+") && device.driver.matches("a(?i)b") && device.driver.matches("[{1001}]")', None),
    ('duration("1h30m") > duration("0") && timestamp("2026-01-02T15:04:05Z") > timestamp("2026-01-01T00:00:00+01:00")',
     None),
    ('device.driver in ["a", "b"] && 1 in [1, null] && [[1], ["a"]] != [] && {"a": 1, "b": 2}["a"] == 1', None),
    ("true ? true : 1 == 1", None),  # the false branch is `1 == 1`, a bool
    ('device.attributes["gpu.nvidia.com"].productName == 5', None),  # attributes are dyn: compiles, false at runtime
]


@pytest.mark.parametrize(("expression", "problem"), STATIC_CEL)
def test_selectors_are_checked_as_kubernetes_compiles_them(expression: str, problem: str | None) -> None:
    found = static_problems(expression)
    if problem is None:
        assert found == ()
        assert read_submission(json.dumps(selecting(expression)).encode(), TENANT)
    else:
        assert any(problem in p for p in found), found
        with pytest.raises(InvalidClaim, match=re.escape(f"{EXACT}.selectors[0].cel.expression: CEL compile error")):
            read_submission(json.dumps(selecting(expression)).encode(), TENANT)


def test_a_claim_stored_before_these_rules_still_reads() -> None:
    """The allocator re-reads stored claims with the model alone: a row an earlier version wrote (any status,
    the metadata it kept) must still load, or the queue could not be read."""
    stored = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": "c", "namespace": TENANT, "labels": {}, "annotations": {}, "generateName": "Bad_"},
              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}},
              "status": "anything at all"}
    assert dra.ResourceClaim.model_validate(stored).metadata.name == "c"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_numbers_json_loads_takes_and_the_api_server_refuses(number: str) -> None:
    """json.loads reads NaN, Infinity and 1e999 (as infinity); Go's decoder refuses them, even in parameters."""
    payload = _twice(config(opaque(parameters={"kind": "GpuConfig", "replicas": 2})), '"replicas": 2',
                     f'"replicas": {number}')
    with pytest.raises(InvalidClaim, match="the API server's decoder refuses it") as caught:
        read_submission(payload, TENANT)
    assert caught.value.name == "claim", "the name is read all the same: the Rejected status says why"


@pytest.mark.parametrize(("timestamp", "accepted"), [
    ("2026-01-02T15:04:05Z", True), ("2026-01-02T15:04:05+02:00", True), ("2026-01-02T15:04:05", False),
    ("2026-01-02", False)])
def test_an_unquoted_yaml_timestamp_reads_as_its_text(timestamp: str, accepted: bool) -> None:
    """simulate reads YAML, where an unquoted time is a datetime: it is checked as the text kubectl sends."""
    document = yaml.safe_load(f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
                              f"metadata: {{name: c, namespace: t1, creationTimestamp: {timestamp}}}\n"
                              "spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}")
    if accepted:
        assert dra.parse_claim(document).metadata.creation_timestamp == timestamp
    else:
        with pytest.raises(dra.DocumentError, match="metadata.creationTimestamp: .* must be an RFC 3339 time"):
            dra.parse_claim(document)
