"""A hostile corpus: named submit and release messages that once crashed, stalled or fooled the allocator.

Every case is built here, in code, deterministically (no large files in the repository): the same list on
every run, in the same order. A case is a message as a tenant would publish it: the tenant token of its
subject, the exact payload bytes, and what the broker must make of it:

- "invalid": `shared.dra.claims.read_submission` refuses it (InvalidClaim): not a claim, or a claim that
  Kubernetes' API validation would refuse as written (schema, names, types, annotations);
- "rejected": refused either way, by read_submission or by the decision core with a Rejected state and a
  reason (CEL errors, limits: the broker may find these at read time or at decision time);
- "accepted": a claim the core decides, Allocated or Pending with a reason.

`alternatives` lists other outcomes a correct broker may give, only where Kubernetes itself accepts a
claim that the broker's CEL engine may reasonably refuse with a reason (a 1,000-term `&&` chain that cel-go
balances, a cel.bind chain whose textual expansion is exponential). Each case carries its class (`klass`,
one of CLASSES) so counts and samples can cover every class.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

Expect = Literal["rejected", "invalid", "accepted"]
PREFIX = "claimbroker.v1"
TENANT = "t1"

CEL = "cel"  # CEL runtime and compile errors, deep nesting, cel.bind chains, huge expressions
NOT_A_CLAIM = "not-a-claim"  # payloads that are not claims at all: wrong JSON types, bad bytes, huge payloads
SUBJECT = "subject"  # subjects with extra tokens, tenant tokens a namespace cannot be
DB_VALUES = "db-values"  # values a database refuses: long names, int32 overflow, NUL, odd digits; releases
VALIDATION = "validation"  # what Kubernetes' API validation refuses and a loose reader lets through
VALID = "valid"  # ordinary claims, interleaved: they must stay accepted
CLASSES = (CEL, NOT_A_CLAIM, SUBJECT, DB_VALUES, VALIDATION, VALID)

GPU = "gpu.nvidia.com"
MIG = "mig.nvidia.com"
ATTR = 'device.attributes["gpu.nvidia.com"]'
LAB = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "lab.yaml"


@dataclass(frozen=True)
class Case:
    id: str
    subject_tenant: str
    payload: bytes
    expect: Expect
    klass: str
    action: Literal["submit", "release"] = "submit"
    subject_override: str | None = None  # the exact subject, when it is not <prefix>.claims.<action>.<tenant>
    name: str | None = None  # the claim name the payload carries (or releases), where one can be read
    alternatives: tuple[Expect, ...] = ()
    note: str = field(default="", compare=False)

    @property
    def subject(self) -> str:
        return self.subject_override or f"{PREFIX}.claims.{self.action}.{self.subject_tenant}"

    def allows(self, outcome: Expect) -> bool:
        return outcome == self.expect or outcome in self.alternatives


def claim_document(name: Any = "claim", *, requests: Any = None, namespace: Any = None,
                   annotations: Any = None, constraints: Any = None, config: Any = None,
                   **extra: Any) -> dict[str, Any]:
    """A ResourceClaim as a tenant writes it; every field may be given a hostile value."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if annotations is not None:
        metadata["annotations"] = annotations
    devices: dict[str, Any] = {"requests": requests if requests is not None else [exact()]}
    if constraints is not None:
        devices["constraints"] = constraints
    if config is not None:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": {"devices": devices}, **extra}


def exact(name: Any = "gpu", cls: Any = GPU, count: Any = 1, *selectors: str, **body: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", **body}
    if count is not None:
        spec["count"] = count
    if selectors:
        spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": spec}


def sub(name: Any, cls: Any = GPU, count: Any = 1, *selectors: str, **body: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "deviceClassName": cls, "count": count, **body}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return spec


def first_available(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": list(subs)}


def dumps(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def normal_claim(name: str, namespace: str | None = None) -> bytes:
    """A claim for one GPU of any kind, which the fleet always has: what must keep working next to the
    hostile cases."""
    return dumps(claim_document(name, namespace=namespace))


class _Corpus:
    def __init__(self) -> None:
        self.cases: list[Case] = []
        self.ids: set[str] = set()

    def add(self, id: str, payload: bytes | dict[str, Any] | list[Any], expect: Expect, klass: str, *,
            tenant: str = TENANT, name: str | None = None, action: Literal["submit", "release"] = "submit",
            subject: str | None = None, alternatives: tuple[Expect, ...] = (), note: str = "") -> None:
        assert id not in self.ids, id
        self.ids.add(id)
        if not isinstance(payload, bytes):
            payload = dumps(payload)
        self.cases.append(Case(id, tenant, payload, expect, klass, action, subject, name, alternatives, note))

    def claim(self, id: str, expect: Expect, klass: str, *, name: str | None = None,
              alternatives: tuple[Expect, ...] = (), note: str = "", **fields: Any) -> None:
        """A claim named after its case (names are unique across the corpus), with some hostile fields."""
        name = id if name is None else name
        self.add(id, claim_document(name, **fields), expect, klass, name=name, alternatives=alternatives,
                 note=note)


# --- CEL ------------------------------------------------------------------------------------------------

RUNTIME_ERRORS: tuple[tuple[str, str, tuple[Expect, ...]], ...] = (
    ("missing-attr", f'{ATTR}.nonexistent > 0', ()),
    ("missing-domain", 'device.attributes["example.com"].foo == 1', ()),
    ("missing-capacity", f'device.capacity["{GPU}"].bogus.compareTo(quantity("1")) > 0', ()),
    ("div-zero", "1 / 0 == 1", ()),
    ("mod-zero", "1 % 0 == 0", ()),
    ("div-zero-attr", f'{ATTR}["numa-node"] / 0 == 0', ()),
    ("non-bool-string", '"x"', ()),
    ("non-bool-int", "1", ()),
    ("non-bool-attr", f"{ATTR}.productName", ()),
    ("non-bool-list", "[true]", ()),
    ("non-bool-map", '{"a": true}', ()),
    ("non-bool-null", "null", ()),
    ("non-bool-double", "1.5", ()),
    ("regex-bracket", f'{ATTR}.productName.matches("[")', ()),
    ("regex-group", f'{ATTR}.productName.matches("(?P<x")', ()),
    ("regex-repeat", f'{ATTR}.productName.matches("a{{1001}}")', ()),
    # cel-go's heterogeneous equality makes this false (no device matches: Pending); a runtime error
    # (Rejected) is what cel-python gives and what the contract describes.
    ("type-eq", f"{ATTR}.productName == 5", ("accepted",)),
    ("type-lt", f"{ATTR}.productName < 5", ()),
    ("type-add", '"a" + 1 == "a1"', ()),
    ("type-size", "size(5) == 1", ()),
    ("dyn-add", 'dyn(1) + "a" == "1a"', ()),
    ("dyn-compare", f"dyn({ATTR}.productName) > 5", ()),
    ("dyn-missing", f"dyn({ATTR}).missing == 1", ()),
    ("quantity-invalid", 'quantity("abc").isGreaterThan(quantity("1"))', ()),
    ("int-overflow-add", "9223372036854775807 + 1 > 0", ()),
    ("int-overflow-mul", "9223372036854775807 * 2 > 0", ()),
    ("int-overflow-sub", "-9223372036854775807 - 2 < 0", ()),
    ("int-literal-overflow", "9223372036854775808 > 0", ()),
    ("uint-underflow", "0u - 1u > 0u", ()),
    ("double-to-int", "int(1e300) > 0", ()),
    ("string-to-int", 'int("x") == 1', ()),
    ("list-index", "[1, 2][5] == 1", ()),
    ("map-key", '{"a": 1}["b"] == 1', ()),
    ("semver-invalid", 'semver("not-a-version").major() == 1', ()),
    ("null-member", "null.foo == 1", ()),
    ("unknown-function", "nosuchfn(1) == 1", ()),
    ("unknown-variable", 'pod.name == "x"', ()),
)
GUARD = f'{ATTR}.productName == "H100"'  # true on some devices only: the bad selector runs on those
PLACEMENTS = ("exactly", "first-available", "mig")
GUARDED = ("missing-attr", "div-zero", "non-bool-string", "regex-bracket", "type-lt", "int-overflow-add")

HUGE_QUANTITY: tuple[tuple[str, str, tuple[Expect, ...]], ...] = (
    # Kubernetes has no `>` on quantities: a compile error there; here it must not stall the allocator.
    ("quantity-huge-gt", 'quantity("1e999999999") > quantity("1")', ()),
    # Kubernetes evaluates this (true); the broker may refuse it as too expensive, with a reason.
    ("quantity-huge", 'quantity("1e999999999").isGreaterThan(quantity("1"))', ("accepted",)),
)


def _bind_chain(limit: int) -> str:
    """cel.bind(a,1,cel.bind(b,a+a,...)): each level doubles the text a substituting rewrite produces."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    levels, previous = 2, ""
    while True:
        text = "cel.bind(a,1," + "".join(f"cel.bind({letters[i]},{letters[i - 1]}+{letters[i - 1]},"
                                           for i in range(1, levels + 1))
        text += f"{letters[levels]}>0" + ")" * (levels + 1)
        if len(text) > limit:
            return previous
        previous = text
        levels += 1


def _padded(length: int) -> str:
    """A valid expression of exactly `length` characters."""
    head = 'device.driver != "'
    return head + "x" * (length - len(head) - 1) + '"'


DEEP: tuple[tuple[str, str, Expect, tuple[Expect, ...]], ...] = (
    # cel-go balances && / || chains and collapses runs of ! and -: Kubernetes accepts these.
    ("and-chain-1000", " && ".join(["true"] * 1000), "accepted", ("rejected",)),
    ("or-chain-1000", " || ".join(["false"] * 999 + ["true"]), "accepted", ("rejected",)),
    ("not-5000", "!" * 5000 + "true", "accepted", ("rejected",)),
    ("neg-5000", "-" * 5000 + "1 < 2", "accepted", ("rejected",)),
    # Beyond cel-go's parser recursion limit (250): Kubernetes refuses these.
    ("parens-1000", "(" * 1000 + "true" + ")" * 1000, "rejected", ()),
    ("parens-4000", "(" * 4000 + "true" + ")" * 4000, "rejected", ()),
    ("lists-1000", "[" * 1000 + "]" * 1000 + " == []", "rejected", ()),
    ("calls-1000", "size(" * 1000 + '"a"' + ")" * 1000 + " > 0", "rejected", ()),
    ("add-chain-2000", " + ".join(["1"] * 2000) + " > 0", "rejected", ("accepted",)),
    ("ternary-600", "false ? false : " * 600 + "true", "rejected", ("accepted",)),
    ("member-chain-2000", ATTR + ".a" * 2000 + " == 1", "rejected", ()),
    ("index-chain-1000", "device.attributes" + '["a"]' * 1000 + " == 1", "rejected", ()),
    # Kubernetes evaluates binds lazily (true); a substituting rewrite grows exponentially: refuse it or
    # evaluate it, never stall.
    ("bind-chain-270", _bind_chain(270), "accepted", ("rejected",)),
    ("bind-chain-400", _bind_chain(400), "accepted", ("rejected",)),
    ("bind-comprehension", "cel.bind(a, [" + ",".join(["1"] * 48) + "], a.all(w, a.all(x, a.all(y, a.all(z, "
                           "true)))))", "rejected", ()),
    ("bind-not-a-name", "cel.bind(1, 2, true)", "rejected", ()),
    ("bind-unbalanced", "cel.bind(a, (1, true", "rejected", ()),
    ("bind-shadow", "cel.bind(a, 1, cel.bind(a, a + 1, a == 2))", "accepted", ("rejected",)),
    ("comprehension-cost", "[" + ",".join(["1"] * 48) + "].all(x, [" + ",".join(["1"] * 48) + "].all(y, [" +
     ",".join(["1"] * 48) + "].all(z, [" + ",".join(["1"] * 48) + "].all(w, true))))", "rejected", ()),
    ("length-10240", _padded(10240), "accepted", ()),
    ("length-10241", _padded(10241), "rejected", ()),
    ("length-100k", _padded(100_000), "rejected", ()),
)

SYNTAX = (
    ("dangling-op", "device.driver =="),
    ("open-parens", "((("),
    ("unterminated", '"unterminated'),
    ("open-index", "device.attributes["),
    ("bare-and", "&&"),
    ("double-op", "1 +* 2 == 3"),
    ("triple-amp", 'device.driver == "x" &&& true'),
    ("nul", "true\x00"),
    ("empty", ""),
    ("blank", "   "),
    ("semicolon", "true; false"),
    ("braces", "{{}}"),
    ("double-dot", "device..driver == 1"),
    ("optional-dangling", f"{ATTR}.?productName"),
    ("optional-unbalanced", f'{ATTR}.?productName.orValue("x"'),
    ("non-ascii-ident", "ñ == ñ"),
    ("bytes-escape", 'b"\\xff" == b"\\xff" &&'),
    ("macro-bad-var", "[1].all(1, true)"),
)


def _cel_request(placement: str, *selectors: str) -> dict[str, Any]:
    if placement == "exactly":
        return exact("gpu", GPU, 1, *selectors)
    if placement == "mig":
        return exact("slice", MIG, 1, *selectors)
    # No node has 16 GPUs: the first subrequest never fits, so the second one's selector runs.
    return first_available("gpu", sub("sixteen", GPU, 16), sub("one", GPU, 1, *selectors))


def _cel(corpus: _Corpus) -> None:
    for key, expression, alternatives in RUNTIME_ERRORS:
        for placement in PLACEMENTS:
            corpus.claim(f"cel-{key}-{placement}", "rejected", CEL, alternatives=alternatives,
                         requests=[_cel_request(placement, expression)])
        if key in GUARDED:
            corpus.claim(f"cel-{key}-guarded", "rejected", CEL, alternatives=alternatives,
                         requests=[_cel_request("exactly", GUARD, expression)])
    for key, expression, alternatives in HUGE_QUANTITY:
        corpus.claim(f"cel-{key}", "rejected", CEL, alternatives=alternatives,
                     requests=[_cel_request("exactly", expression)])
    for key, expression, expect, alternatives in DEEP:
        for placement in ("exactly", "first-available"):
            corpus.claim(f"cel-{key}-{placement}", expect, CEL, alternatives=alternatives,
                         requests=[_cel_request(placement, expression)])
    for key, expression in SYNTAX:
        corpus.claim(f"cel-syntax-{key}", "rejected", CEL, requests=[_cel_request("exactly", expression)])
    for key, expression in SYNTAX[:4]:
        corpus.claim(f"cel-syntax-{key}-first-available", "rejected", CEL,
                     requests=[_cel_request("first-available", expression)])
    # Valid CEL that reads what only some devices have, guarded as DRA documents it: accepted.
    corpus.claim("cel-mig-profile", "accepted", CEL,
                 requests=[exact("slice", MIG, 1, f'{ATTR}.profile == "1g.10gb"')])
    corpus.claim("cel-profile-on-whole-gpus", "rejected", CEL,
                 requests=[exact("gpu", GPU, 1, f'{ATTR}.profile == "1g.10gb"')],
                 note="the report's case: whole GPUs have no profile attribute")
    corpus.claim("cel-guarded-has", "accepted", CEL,
                 requests=[exact("gpu", GPU, 1, f'has({ATTR}.profile) && {ATTR}.profile == "1g.10gb" || true')])
    corpus.claim("cel-optional-or-value", "accepted", CEL,
                 requests=[exact("gpu", GPU, 1, f'{ATTR}.?profile.orValue("none") == "none"')])


# --- not a claim ----------------------------------------------------------------------------------------

def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def _not_a_claim(corpus: _Corpus) -> None:
    rng = random.Random(20240611)
    for key, raw in (
        ("list", b"[]"), ("null", b"null"), ("number", b"42"), ("negative-float", b"-1.5e308"),
        ("float-overflow", b"1e999"), ("string", b'"a claim"'), ("true", b"true"), ("false", b"false"),
        ("empty-object", b"{}"), ("empty-payload", b""), ("whitespace", b" \n\t "), ("not-json", b"{not json"),
        ("truncated", normal_claim("truncated")[:40]), ("trailing-garbage", normal_claim("trailing") + b"}}"),
        ("two-documents", normal_claim("two-a") + b"\n" + normal_claim("two-b")),
        ("nan", b'{"apiVersion": NaN}'),
        ("nested-1000-lists", _nested(1000).encode()),
        ("nested-1000-objects", ('{"a":' * 1000 + "1" + "}" * 1000).encode()),
        ("nested-100000-lists", _nested(100_000).encode()),
        ("invalid-utf8", b"\xff\xfe\xfd"),
        ("invalid-utf8-in-claim", normal_claim("utf8").replace(b'"utf8"', b'"utf8\xc3\x28"')),
        ("overlong-utf8", normal_claim("overlong").replace(b'"overlong"', b'"over\xc0\xaflong"')),
        ("garbage-1mb", rng.randbytes(1_000_000)),
        ("garbage-8mb", rng.randbytes(8 * 1024 * 1024)),
    ):
        corpus.add(f"nac-{key}", raw, "invalid", NOT_A_CLAIM)
    # A claim whose body is not an object where one must be.
    for key, document in (
        ("metadata-list", claim_document("x") | {"metadata": []}),
        ("metadata-string", claim_document("x") | {"metadata": "nac-metadata-string"}),
        ("metadata-null", claim_document("x") | {"metadata": None}),
        ("metadata-number", claim_document("x") | {"metadata": 7}),
        ("spec-list", claim_document("nac-spec-list") | {"spec": []}),
        ("spec-string", claim_document("nac-spec-string") | {"spec": "gpu please"}),
        ("spec-null", claim_document("nac-spec-null") | {"spec": None}),
        ("spec-missing", {k: v for k, v in claim_document("nac-spec-missing").items() if k != "spec"}),
        ("devices-list", claim_document("nac-devices-list") | {"spec": {"devices": []}}),
        ("requests-object", claim_document("nac-requests-object", requests={"gpu": {}})),
        ("requests-null", claim_document("nac-requests-null") | {"spec": {"devices": {"requests": None}}}),
        ("request-string", claim_document("nac-request-string", requests=["gpu"])),
        ("exactly-list", claim_document("nac-exactly-list", requests=[{"name": "gpu", "exactly": []}])),
        ("selectors-object", claim_document("nac-selectors-object", requests=[exact(selectors={})])),
        ("selector-string", claim_document("nac-selector-string", requests=[exact(selectors=["true"])])),
        ("annotations-list", claim_document("nac-annotations-list", annotations=["a"])),
        ("annotation-number", claim_document("nac-annotation-number", annotations={"claimbroker.io/priority": 5})),
        ("annotation-null", claim_document("nac-annotation-null", annotations={"claimbroker.io/priority": None})),
        ("name-number", claim_document(5)),
        ("name-list", claim_document(["a"])),
        ("name-empty", claim_document("")),
        ("kind-missing", {k: v for k, v in claim_document("nac-kind-missing").items() if k != "kind"}),
        ("kind-pod", claim_document("nac-kind-pod") | {"kind": "Pod"}),
        ("kind-list", claim_document("nac-kind-list") | {"kind": ["ResourceClaim"]}),  # found by the fuzz test
        ("kind-object", claim_document("nac-kind-object") | {"kind": {}}),
        ("api-version-object", claim_document("nac-api-version-object") | {"apiVersion": {"v": 1}}),
        ("kind-slice", claim_document("nac-kind-slice") | {"kind": "ResourceSlice"}),
        ("api-v1beta1", claim_document("nac-api-v1beta1") | {"apiVersion": "resource.k8s.io/v1beta1"}),
    ):
        name = document["metadata"].get("name") if isinstance(document.get("metadata"), dict) else None
        corpus.add(f"nac-{key}", document, "invalid", NOT_A_CLAIM,
                   name=name if isinstance(name, str) and name else None)
    # JSON nested deep inside fields a claim may hold: an opaque config's parameters, and a field that
    # must be a string.
    deep = json.loads(_nested(200))
    corpus.claim("nac-deep-parameters-200", "accepted", NOT_A_CLAIM,
                 config=[{"requests": ["gpu"], "opaque": {"driver": GPU, "parameters": {"deep": deep}}}])
    corpus.add("nac-deep-parameters-1000",
               normal_claim("nac-deep-parameters-1000").replace(
                   b'"spec":{"devices":{',
                   b'"spec":{"devices":{"config":[{"requests":["gpu"],"opaque":{"driver":"gpu.nvidia.com",'
                   b'"parameters":' + _nested(1000).encode() + b"}}],"),
               "invalid", NOT_A_CLAIM, name="nac-deep-parameters-1000")
    corpus.add("nac-deep-name-1000", normal_claim("x").replace(b'"name":"x"', b'"name":' + _nested(1000).encode()),
               "invalid", NOT_A_CLAIM)
    # Unicode that cannot be stored or sent: a lone surrogate (a \\ud800 escape), NUL characters.
    surrogate = normal_claim("nac-surrogate-annotation").replace(
        b'"metadata":{', b'"metadata":{"annotations":{"note":"\\ud800"},')
    corpus.add("nac-surrogate-annotation", surrogate, "invalid", NOT_A_CLAIM, name="nac-surrogate-annotation",
               alternatives=("accepted",), note="Go's decoder would read U+FFFD; refusing it is as good")
    corpus.add("nac-surrogate-name", normal_claim("x").replace(b'"name":"x"', b'"name":"nac-\\udc00"'),
               "invalid", NOT_A_CLAIM)
    corpus.add("nac-surrogate-pair-name", normal_claim("x").replace(b'"name":"x"', b'"name":"nac-\\ud83d\\ude00"'),
               "invalid", NOT_A_CLAIM)
    corpus.claim("nac-nul-name", "invalid", NOT_A_CLAIM, name="nac\x00nul")
    corpus.claim("nac-nul-namespace", "invalid", NOT_A_CLAIM, namespace="t1\x00")
    corpus.claim("nac-nul-request", "invalid", NOT_A_CLAIM, requests=[exact("g\x00pu")])
    corpus.claim("nac-nul-class", "rejected", NOT_A_CLAIM, requests=[exact("gpu", "gpu.nvidia.com\x00")])
    corpus.claim("nac-nul-annotation", "accepted", NOT_A_CLAIM, annotations={"note": "a\x00b"},
                 alternatives=("invalid",), note="Kubernetes keeps it; a broker that cannot store it refuses it")
    # Huge payloads that look like claims: padding in an annotation (Kubernetes caps annotations at 256 KiB).
    corpus.claim("nac-annotation-1mb", "invalid", NOT_A_CLAIM, annotations={"pad": "x" * 1_000_000})
    corpus.claim("nac-annotation-8mb", "invalid", NOT_A_CLAIM, annotations={"pad": "x" * (8 * 1024 * 1024)})
    corpus.claim("nac-annotation-300kb", "invalid", NOT_A_CLAIM, annotations={"pad": "x" * 300_000})
    corpus.claim("nac-namespace-1mb", "invalid", NOT_A_CLAIM, namespace="n" * 1_000_000,
                 note="a reason that quotes the namespace would be 1 MB")
    # Huge numbers and huge lists.
    corpus.claim("nac-count-1e9", "rejected", NOT_A_CLAIM, requests=[exact("gpu", GPU, 10**9)])
    corpus.claim("nac-count-2-63", "rejected", NOT_A_CLAIM, requests=[exact("gpu", GPU, 2**63)])
    corpus.claim("nac-count-10-100", "rejected", NOT_A_CLAIM, requests=[exact("gpu", GPU, 10**100)])
    corpus.claim("nac-count-float", "rejected", NOT_A_CLAIM, requests=[exact("gpu", GPU, 1e9)])
    corpus.claim("nac-count-1-5", "invalid", NOT_A_CLAIM, requests=[exact("gpu", GPU, 1.5)])
    corpus.claim("nac-requests-10000", "rejected", NOT_A_CLAIM, requests=[exact(f"r{i}") for i in range(10_000)])
    corpus.claim("nac-selectors-10000", "rejected", NOT_A_CLAIM,
                 requests=[exact("gpu", GPU, 1, *[f'device.driver != "x{i}"' for i in range(10_000)])])
    corpus.claim("nac-same-selector-10000", "rejected", NOT_A_CLAIM,
                 requests=[exact("gpu", GPU, 1, *['device.driver == "gpu.nvidia.com"'] * 10_000)])
    corpus.claim("nac-constraints-10000", "rejected", NOT_A_CLAIM,
                 constraints=[{"matchAttribute": "gpu.nvidia.com/numa-node"}] * 10_000)
    corpus.claim("nac-config-10000", "rejected", NOT_A_CLAIM,
                 config=[{"opaque": {"driver": GPU, "parameters": {}}}] * 10_000)
    corpus.claim("nac-subrequests-10000", "invalid", NOT_A_CLAIM,
                 requests=[first_available("gpu", *[sub(f"s{i}") for i in range(10_000)])])
    corpus.claim("nac-tolerations-10000", "rejected", NOT_A_CLAIM,
                 requests=[exact("gpu", GPU, 1, tolerations=[{"operator": "Exists"}] * 10_000)])


# --- subjects -------------------------------------------------------------------------------------------

BAD_TENANTS = (
    ("dollar", "t$1"), ("percent", "t%1"), ("accent", "tenänt"), ("emoji", "team😀"),
    ("upper", "Team"), ("underscore", "t_1"), ("long-64", "t" * 64), ("long-254", "t" * 254),
    ("long-300", "t" * 300), ("leading-hyphen", "-t1"),
)


def _subjects(corpus: _Corpus) -> None:
    for key, tenant in BAD_TENANTS:
        corpus.add(f"subject-tenant-{key}", normal_claim(f"subject-tenant-{key}"), "invalid", SUBJECT,
                   tenant=tenant, name=f"subject-tenant-{key}")
        corpus.add(f"subject-tenant-{key}-namespaced",
                   normal_claim(f"subject-tenant-{key}-namespaced", namespace=tenant), "invalid", SUBJECT,
                   tenant=tenant, name=f"subject-tenant-{key}-namespaced")
    for key, tenant in BAD_TENANTS[:4]:
        corpus.add(f"subject-release-tenant-{key}", {"name": "anything"}, "invalid", SUBJECT, tenant=tenant,
                   action="release", name="anything")
    for action in ("submit", "release"):
        payload = normal_claim(f"subject-extra-{action}") if action == "submit" else dumps({"name": "x"})
        corpus.add(f"subject-extra-token-{action}", payload, "invalid", SUBJECT, tenant="t1.extra",
                   action=action, subject=f"{PREFIX}.claims.{action}.{TENANT}.extra",
                   name=f"subject-extra-{action}" if action == "submit" else "x")
        corpus.add(f"subject-two-extra-tokens-{action}", payload, "invalid", SUBJECT, tenant="t1.a.b",
                   action=action, subject=f"{PREFIX}.claims.{action}.{TENANT}.a.b")
    # The namespace in the document names another tenant, or is not a tenant at all.
    corpus.claim("subject-namespace-other", "invalid", SUBJECT, namespace="t2")
    corpus.claim("subject-namespace-upper", "invalid", SUBJECT, namespace="T1")
    corpus.claim("subject-namespace-number", "invalid", SUBJECT, namespace=7)


# --- values a database refuses, and release messages ------------------------------------------------------

def _db_values(corpus: _Corpus) -> None:
    corpus.claim("db-name-254", "invalid", DB_VALUES, name="n" * 254)
    corpus.claim("db-name-1000", "invalid", DB_VALUES, name="n" * 1000)
    corpus.claim("db-name-253", "accepted", DB_VALUES, name="n" * 253)
    corpus.claim("db-request-name-254", "invalid", DB_VALUES, requests=[exact("r" * 254)])
    corpus.claim("db-class-name-300", "rejected", DB_VALUES, requests=[exact("gpu", "c" * 300)])
    for key, value, expect in (
        ("2147483648", "2147483648", "invalid"), ("minus-2147483649", "-2147483649", "invalid"),
        ("2-63", str(2**63), "invalid"), ("10-400", "1" + "0" * 400, "invalid"),
        ("arabic-indic", "٣", "invalid"), ("underscore", "1_000", "invalid"), ("spaces", " 5 ", "invalid"),
        ("fullwidth", "５", "invalid"), ("float", "5.0", "invalid"), ("hex", "0x10", "invalid"),
        ("empty", "", "invalid"), ("exponent", "1e3", "invalid"),
        ("2147483647", "2147483647", "accepted"), ("minus-2147483648", "-2147483648", "accepted"),
    ):
        corpus.claim(f"db-priority-{key}", expect, DB_VALUES,  # type: ignore[arg-type]
                     annotations={"claimbroker.io/priority": value})
    for key, value, expect in (("maybe", "maybe", "invalid"), ("yes", "yes", "invalid"),
                               ("false-upper", "False", "accepted"), ("true", "true", "accepted")):
        corpus.claim(f"db-preemptible-{key}", expect, DB_VALUES,  # type: ignore[arg-type]
                     annotations={"claimbroker.io/preemptible": value})
    # Gangs (claimbroker.io/gang...): what does not read is refused with the annotation named, never a gang
    # that could not complete; a lone member of a valid gang waits, holding nothing.
    gang = "claimbroker.io/gang"
    for key, written in (
        ("size-0", {gang: "g", f"{gang}-size": "0"}), ("size-257", {gang: "g", f"{gang}-size": "257"}),
        ("size-abc", {gang: "g", f"{gang}-size": "abc"}), ("size-negative", {gang: "g", f"{gang}-size": "-1"}),
        ("size-missing", {gang: "g"}), ("size-float", {gang: "g", f"{gang}-size": "2.0"}),
        ("name-underscore", {gang: "train_7", f"{gang}-size": "2"}),
        ("name-64", {gang: "g" * 64, f"{gang}-size": "2"}), ("name-empty", {gang: "", f"{gang}-size": "2"}),
        ("size-without-gang", {f"{gang}-size": "2"}),
        ("topology-without-gang", {f"{gang}-topology": "nvidia.com/gpu.clique"}),
        ("topology-bad-key", {gang: "g", f"{gang}-size": "2", f"{gang}-topology": "not a key!"}),
        ("mode-unknown", {gang: "g", f"{gang}-size": "2", f"{gang}-topology": "rack", f"{gang}-topology-mode": "x"}),
        ("wait-unreadable", {gang: "g", f"{gang}-size": "2", f"{gang}-topology": "rack",
                             f"{gang}-topology-mode": "preferred", f"{gang}-topology-wait": "soon"}),
    ):
        corpus.claim(f"db-gang-{key}", "invalid", DB_VALUES, alternatives=("rejected",), annotations=written)
    corpus.claim("db-gang-lone-member-of-256", "accepted", DB_VALUES,
                 annotations={gang: "g", f"{gang}-size": "256"}, note="waits for 255 more, holding nothing")
    for key, payload, expect, name in (
        ("number", {"name": 5}, "invalid", None), ("list", [], "invalid", None), ("object", {}, "invalid", None),
        ("null", None, "invalid", None), ("string", "x", "invalid", None),
        ("name-null", {"name": None}, "invalid", None),
        ("name-list", {"name": ["a"]}, "invalid", None), ("name-empty", {"name": ""}, "invalid", None),
        ("name-nul", {"name": "a\x00b"}, "invalid", None), ("name-dot", {"name": "a.b"}, "accepted", "a.b"),
        ("name-254", {"name": "n" * 254}, "invalid", None), ("name-space", {"name": "a b"}, "invalid", None),
        ("name-wildcard", {"name": ">"}, "invalid", None),
        ("name-253", {"name": "n" * 253}, "accepted", "n" * 253),
        ("unknown-claim", {"name": "never-submitted"}, "accepted", "never-submitted"),
    ):
        corpus.add(f"release-{key}", dumps(payload), expect, DB_VALUES, action="release", name=name)  # type: ignore[arg-type]
    corpus.add("release-surrogate", b'{"name": "a\\ud800"}', "invalid", DB_VALUES, action="release")
    for key, raw in (("empty", b""), ("not-json", b"{name"), ("invalid-utf8", b'{"name": "\xff"}'),
                     ("nested-1000", _nested(1000).encode()), ("garbage-1mb", random.Random(7).randbytes(1_000_000)),
                     ("padded-1mb", dumps({"name": "x", "pad": "p" * 1_000_000}))):
        corpus.add(f"release-{key}", raw, "invalid" if key != "padded-1mb" else "accepted", DB_VALUES,
                   action="release", name="x" if key == "padded-1mb" else None)


# --- validation looser than Kubernetes' -----------------------------------------------------------------

def _validation(corpus: _Corpus) -> None:
    for key, name in (("upper", "UPPER"), ("underscore", "under_score"), ("leading-hyphen", "-leading"),
                      ("trailing-hyphen", "trailing-"), ("dot-dot", "a..b"), ("space", "a b"), ("slash", "a/b"),
                      ("wildcard", "a*"), ("gt", ">")):
        corpus.claim(f"val-claim-name-{key}", "invalid", VALIDATION, name=name)
    corpus.claim("val-claim-name-dot", "accepted", VALIDATION, name="train.v2",
                 note="a claim name is a DNS subdomain: its '.' is written '_' in its status subject")
    corpus.claim("val-claim-name-64", "accepted", VALIDATION, name="v" * 64,
                 note="a claim name is a DNS subdomain: up to 253 characters")
    for key, name in (("upper", "GPU"), ("underscore", "g_pu"), ("leading-hyphen", "-gpu"), ("64", "g" * 64),
                      ("empty", ""), ("dot", "g.pu")):
        corpus.claim(f"val-request-name-{key}", "invalid", VALIDATION, requests=[exact(name)])
        corpus.claim(f"val-subrequest-name-{key}", "invalid", VALIDATION,
                     requests=[first_available("gpu", sub(name))])
    corpus.claim("val-request-name-63", "accepted", VALIDATION, requests=[exact("g" * 63)])
    corpus.claim("val-duplicate-requests", "invalid", VALIDATION, requests=[exact("gpu"), exact("gpu")])
    corpus.claim("val-duplicate-subrequests", "invalid", VALIDATION,
                 requests=[first_available("gpu", sub("a"), sub("a"))])
    corpus.claim("val-config-unknown-request", "invalid", VALIDATION,
                 config=[{"requests": ["nope"], "opaque": {"driver": GPU, "parameters": {}}}])
    corpus.claim("val-config-subrequest", "accepted", VALIDATION,
                 requests=[first_available("gpu", sub("one"))],
                 config=[{"requests": ["gpu/one"], "opaque": {"driver": GPU, "parameters": {}}}])
    corpus.claim("val-config-empty-subrequest", "invalid", VALIDATION,
                 config=[{"requests": ["gpu/"], "opaque": {"driver": GPU, "parameters": {}}}],
                 note="validateRequestNameRef: each segment of request/subrequest must be a DNS label")
    corpus.claim("val-constraint-unknown-request", "rejected", VALIDATION,
                 constraints=[{"requests": ["nope"], "matchAttribute": "gpu.nvidia.com/numa-node"}])
    corpus.claim("val-constraint-both", "invalid", VALIDATION,
                 constraints=[{"matchAttribute": "gpu.nvidia.com/numa-node",
                               "distinctAttribute": "gpu.nvidia.com/uuid"}])
    # v1's count is a plain int64 with omitempty: 0 reads as unset and defaults to 1, as the API server does.
    for key, count, expect in (("string", "1", "invalid"), ("true", True, "invalid"), ("zero", 0, "accepted"),
                               ("minus-one", -1, "invalid"), ("33", 33, "rejected"), ("list", [1], "invalid"),
                               ("object", {}, "invalid")):
        corpus.claim(f"val-count-{key}", expect, VALIDATION, requests=[exact("gpu", GPU, count)])  # type: ignore[arg-type]
    corpus.claim("val-count-null", "accepted", VALIDATION, requests=[{
        "name": "gpu", "exactly": {"deviceClassName": GPU, "allocationMode": "ExactCount", "count": None}}],
                 note="JSON null is an unset optional field in Kubernetes: count defaults to 1")
    corpus.claim("val-subrequest-count-string", "invalid", VALIDATION,
                 requests=[first_available("gpu", sub("one", GPU, "1"))])
    corpus.claim("val-admin-access-yes", "invalid", VALIDATION, requests=[exact("gpu", GPU, 1, adminAccess="yes")])
    corpus.claim("val-admin-access-one", "invalid", VALIDATION, requests=[exact("gpu", GPU, 1, adminAccess=1)])
    corpus.claim("val-mode-some", "invalid", VALIDATION, requests=[exact("gpu", GPU, 1, allocationMode="Some")])
    corpus.claim("val-mode-lowercase", "invalid", VALIDATION, requests=[exact("gpu", GPU, None, allocationMode="all")])
    corpus.claim("val-mode-all-with-count", "invalid", VALIDATION,
                 requests=[exact("gpu", GPU, 2, allocationMode="All")])
    corpus.claim("val-class-empty", "invalid", VALIDATION, requests=[exact("gpu", "")])
    corpus.claim("val-class-unknown", "rejected", VALIDATION, requests=[exact("gpu", "tpu.google.com")])
    corpus.claim("val-exactly-and-first-available", "invalid", VALIDATION,
                 requests=[exact("gpu") | {"firstAvailable": [sub("one")]}])
    corpus.claim("val-neither-exactly-nor-first-available", "invalid", VALIDATION, requests=[{"name": "gpu"}])
    corpus.claim("val-first-available-empty", "invalid", VALIDATION, requests=[first_available("gpu")])
    corpus.claim("val-first-available-9", "invalid", VALIDATION,
                 requests=[first_available("gpu", *[sub(f"s{i}") for i in range(9)])])
    corpus.claim("val-no-requests", "rejected", VALIDATION, requests=[])
    corpus.claim("val-requests-33", "rejected", VALIDATION, requests=[exact(f"r{i}") for i in range(33)])
    corpus.claim("val-selector-no-expression", "invalid", VALIDATION,
                 requests=[exact("gpu", GPU, 1) | {"exactly": {"deviceClassName": GPU, "selectors": [{"cel": {}}]}}])
    corpus.claim("val-selector-number", "invalid", VALIDATION,
                 requests=[exact("gpu", GPU, 1) | {"exactly": {"deviceClassName": GPU,
                                                              "selectors": [{"cel": {"expression": 5}}]}}])
    corpus.claim("val-toleration-operator", "invalid", VALIDATION,
                 requests=[exact("gpu", GPU, 1, tolerations=[{"key": "a", "operator": "Maybe"}])])
    corpus.claim("val-capacity-not-quantity", "rejected", VALIDATION,
                 requests=[exact("gpu", GPU, 1, capacity={"requests": {"memory": "lots"}})])
    corpus.claim("val-match-attribute-not-a-name", "rejected", VALIDATION,
                 constraints=[{"matchAttribute": "not a name!"}])
    for key, where in (("top", "top"), ("spec", "spec"), ("devices", "devices"), ("request", "request"),
                       ("exactly", "exactly"), ("selector", "selector")):
        document = claim_document(f"val-unknown-field-{key}",
                                  requests=[exact("gpu", GPU, 1, 'device.driver == "gpu.nvidia.com"')])
        target = {"top": document, "spec": document["spec"], "devices": document["spec"]["devices"],
                  "request": document["spec"]["devices"]["requests"][0],
                  "exactly": document["spec"]["devices"]["requests"][0]["exactly"],
                  "selector": document["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]}[where]
        target["bogusField"] = True
        corpus.add(f"val-unknown-field-{key}", document, "invalid", VALIDATION, name=f"val-unknown-field-{key}")
    tolerant = claim_document("val-unknown-metadata-field")
    tolerant["metadata"] |= {"uid": "0b6c2c4e", "resourceVersion": "17", "managedFields": [{"manager": "kubectl"}]}
    corpus.add("val-unknown-metadata-field", tolerant, "invalid", VALIDATION, name="val-unknown-metadata-field",
               note="accepted until issue 35, refused by Kubernetes twice: storage refuses a create with a "
                    "resourceVersion, and ValidateManagedFields an entry without operation Apply or Update")
    corpus.claim("val-status-present", "accepted", VALIDATION, status={"allocation": {"devices": {"results": []}}},
                 note="the API server drops a status on create (resourceclaim strategy PrepareForCreate)")
    _validation_metadata(corpus)
    _validation_decoding(corpus)
    _validation_cel(corpus)


# ObjectMeta as a cluster writes it: a claim copied from one must still read.
CLUSTER_METADATA = {
    "uid": "0b6c2c4e-f88f-11e6-a518-42010a800195", "generation": 1, "creationTimestamp": "2026-01-02T15:04:05Z",
    "labels": {"app.kubernetes.io/name": "trainer"}, "finalizers": ["claimbroker.io/allocation"],
    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                         "uid": "d9607e19-f88f-11e6-a518-42010a800195", "controller": True}],
    "managedFields": [{"manager": "kubectl-create", "operation": "Update", "apiVersion": "resource.k8s.io/v1",
                       "time": "2026-01-02T15:04:05Z", "fieldsType": "FieldsV1",
                       "fieldsV1": {"f:spec": {"f:devices": {".": {}, "f:requests": {}}}}}],
}
OWNER = CLUSTER_METADATA["ownerReferences"][0]  # type: ignore[index]


def _validation_metadata(corpus: _Corpus) -> None:
    """ObjectMeta's rules (apimachinery ValidateObjectMetaAccessor, core validateKubeFinalizerName), its types
    (a field that does not decode is a 400) and what storage refuses on create."""
    for key, fields, expect, note in (
        ("resource-version", {"resourceVersion": "17"}, "invalid",
         'etcd3 store.Create: "resourceVersion should not be set on objects to be created"'),
        ("resource-version-0", {"resourceVersion": "0"}, "accepted", "storage reads 0 as unset"),
        ("generate-name", {"generateName": "Train_"}, "invalid", "NameIsDNSSubdomain(generateName, prefix=true)"),
        ("generate-name-beside-name", {"generateName": "train-"}, "accepted", "a trailing '-' is allowed"),
        ("generation-negative", {"generation": -1}, "invalid", "ValidateNonnegativeField(generation)"),
        ("generation-string", {"generation": "1"}, "invalid", "generation is an int64"),
        ("creation-timestamp", {"creationTimestamp": "yesterday"}, "invalid", "metav1.Time decodes RFC 3339 only"),
        ("creation-timestamp-null", {"creationTimestamp": None}, "accepted", "what kubectl --dry-run writes"),
        ("deletion-grace-string", {"deletionGracePeriodSeconds": "30"}, "invalid", "an int64"),
        ("uid-number", {"uid": 5}, "invalid", "uid is a string"),
        ("finalizer-unqualified", {"finalizers": ["my-finalizer"]}, "invalid",
         "validateKubeFinalizerName: neither standard nor fully qualified"),
        ("finalizer-not-a-name", {"finalizers": ["example.com/bad name"]}, "invalid", "IsQualifiedName"),
        ("finalizers-orphan-and-foreground", {"finalizers": ["orphan", "foregroundDeletion"]}, "invalid",
         "ValidateFinalizers: both cannot be set"),
        ("owner-empty", {"ownerReferences": [{}]}, "invalid", "validateOwnerReference: version, kind, name, uid"),
        ("owner-event", {"ownerReferences": [OWNER | {"apiVersion": "v1", "kind": "Event"}]}, "invalid",
         "BannedOwners: v1 Event"),
        ("owner-two-controllers", {"ownerReferences": [OWNER, OWNER | {"name": "b", "uid": "u-2"}]}, "invalid",
         "ValidateOwnerReferences: only one controller"),
        ("managed-fields-operation", {"managedFields": [{"manager": "m", "operation": "Patch"}]}, "invalid",
         "ValidateManagedFields: operation Apply or Update"),
        ("managed-fields-reset", {"managedFields": [{}]}, "accepted", "[{}] asks the field manager to reset them"),
        ("unknown-field", {"colour": "red"}, "invalid", "strict field validation (kubectl's default)"),
        ("cluster-name", {"clusterName": "c1"}, "invalid", "removed from ObjectMeta in 1.25: an unknown field"),
        ("labels-null", {"labels": None}, "accepted", "JSON null is an unset map"),
        ("cluster-copy", CLUSTER_METADATA, "accepted", "a claim copied from a cluster, less its resourceVersion"),
    ):
        document = claim_document(f"val-meta-{key}")
        document["metadata"] |= fields
        corpus.add(f"val-meta-{key}", document, expect, VALIDATION, name=f"val-meta-{key}", note=note)  # type: ignore[arg-type]
    only_generated = claim_document("x")
    only_generated["metadata"] = {"generateName": "val-meta-generated-"}
    corpus.add("val-meta-generate-name-only", only_generated, "invalid", VALIDATION,
               note="Kubernetes would generate a name; the broker cannot, and says so")


def _validation_decoding(corpus: _Corpus) -> None:
    """What strict decoding refuses before validation: a field given twice, a field by its Go name, a status
    that is not a ResourceClaimStatus, a quantity ParseQuantity cannot read."""
    for key, once, twice in (
        ("name", '"name":"val-duplicate-name"', '"name":"val-duplicate-name","name":"val-duplicate-other"'),
        ("count", '"count":1', '"count":1,"count":30'),
        ("spec", '"spec":', '"spec":{},"spec":'),
    ):
        payload = dumps(claim_document(f"val-duplicate-{key}"))
        assert once.encode() in payload, once
        corpus.add(f"val-duplicate-{key}", payload.replace(once.encode(), twice.encode(), 1), "invalid", VALIDATION,
                   name="val-duplicate-other" if key == "name" else f"val-duplicate-{key}",
                   note="strict decoding: duplicate field (json.loads would keep the last)")
    parameters = dumps(claim_document("val-duplicate-in-parameters", config=[
        {"opaque": {"driver": GPU, "parameters": {"sharing": "TimeSlicing"}}}]))
    corpus.add("val-duplicate-in-parameters",
               parameters.replace(b'"sharing":"TimeSlicing"', b'"sharing":"MPS","sharing":"TimeSlicing"'),
               "accepted", VALIDATION, name="val-duplicate-in-parameters",
               note="parameters are a RawExtension, decoded leniently: a key given twice is no error there")
    for key, number in (("nan", b"NaN"), ("infinity", b"-Infinity"), ("float-overflow", b"1e999")):
        document = dumps(claim_document(f"val-json-{key}-in-parameters", config=[
            {"opaque": {"driver": GPU, "parameters": {"replicas": 2}}}]))
        corpus.add(f"val-json-{key}-in-parameters", document.replace(b'"replicas":2', b'"replicas":' + number),
                   "invalid", VALIDATION, name=f"val-json-{key}-in-parameters",
                   note="not JSON, or not a float64: Go's decoder refuses what json.loads reads")
    corpus.claim("val-snake-case-field", "invalid", VALIDATION,
                 requests=[{"name": "gpu", "exactly": {"device_class_name": GPU}}],
                 note="fields have their JSON names only: device_class_name is unknown to the API server")
    corpus.claim("val-status-string", "invalid", VALIDATION, status="Allocated",
                 note="status must decode as a ResourceClaimStatus, even though create drops it")
    corpus.claim("val-status-unknown-field", "invalid", VALIDATION, status={"phase": "Bound"},
                 note="strict field validation inside status")
    corpus.claim("val-quantity-exponent", "invalid", VALIDATION,
                 requests=[exact("gpu", GPU, 1, capacity={"requests": {"memory": "1e9223372036854775808"}})],
                 note="ParseQuantity: a decimal exponent must fit an int64")


def _validation_cel(corpus: _Corpus) -> None:
    """Selectors Kubernetes' CEL compiler refuses at create time, in a branch the broker's evaluation never
    reaches on these devices: before issue 35 the claims were allocated."""
    for key, expression, note in (
        ("undeclared-variable", f'{ATTR}.productName != "" || gpu.ready', "undeclared reference"),
        ("undeclared-function", "true || nosuchfn(1) == 1", "undeclared reference to a function"),
        ("undefined-device-field", 'true || device.model == "H100"', "device is an object type: undefined field"),
        ("mixed-list", 'device.driver in ["gpu.nvidia.com", 1]', "HomogeneousAggregateLiterals"),
        ("ternary-types", "true ? true : 1", "the conditional's branches must have one type"),
        ("regex-literal", 'true || device.driver.matches("[")', "ValidateRegexLiterals (RE2)"),
        ("duration-literal", 'true || duration("1x") > duration("0")', "ValidateDurationLiterals"),
    ):
        corpus.claim(f"val-cel-{key}", "invalid", VALIDATION, requests=[exact("gpu", GPU, 1, expression)], note=note)
    corpus.claim("val-cel-library", "accepted", VALIDATION, requests=[exact(
        "gpu", GPU, 1, 'device.driver.matches("^gpu") && duration("1h") > duration("0s") && [1, 2].all(x, x > 0) && '
                       'cel.bind(d, device.driver, d != "") && type(1) == int')],
                 note="macro and cel.bind variables, namespaces and literals Kubernetes compiles")


# --- valid claims, interleaved --------------------------------------------------------------------------

def _valid() -> list[tuple[str, dict[str, Any]]]:
    claims: list[tuple[str, dict[str, Any]]] = []
    for document in yaml.safe_load_all(LAB.read_text()):
        if document:
            claims.append((f"valid-lab-{document['metadata']['name']}", document))
    claims += [
        ("valid-one-gpu", claim_document("valid-one-gpu")),
        ("valid-two-h100", claim_document("valid-two-h100", requests=[
            exact("gpu", GPU, 2, f'{ATTR}.productName == "H100"')])),
        ("valid-mig", claim_document("valid-mig", requests=[exact("slice", MIG, 1)])),
        ("valid-first-available", claim_document("valid-first-available", requests=[first_available(
            "gpu", sub("h200", GPU, 1, f'{ATTR}.productName == "H200"'), sub("any"))])),
        ("valid-numa-pair", claim_document("valid-numa-pair", requests=[exact("gpu", GPU, 2)],
                                           constraints=[{"matchAttribute": "gpu.nvidia.com/numa-node"}])),
        ("valid-memory", claim_document("valid-memory", requests=[exact(
            "gpu", GPU, 1, f'device.capacity["{GPU}"].memory.compareTo(quantity("100Gi")) >= 0')])),
        ("valid-priority", claim_document("valid-priority", annotations={
            "claimbroker.io/priority": "10", "claimbroker.io/preemptible": "false"})),
        ("valid-32-devices", claim_document("valid-32-devices", requests=[exact("gpu", GPU, 32)])),
        ("valid-all-b200", claim_document("valid-all-b200", requests=[exact(
            "gpu", GPU, None, f'{ATTR}.productName == "B200"', allocationMode="All")])),
        ("valid-namespaced", claim_document("valid-namespaced", namespace=TENANT)),
    ]
    return claims


@functools.lru_cache(maxsize=1)
def build() -> tuple[Case, ...]:
    """The corpus, in a fixed order: the classes interleaved with the valid claims."""
    corpus = _Corpus()
    _cel(corpus)
    _not_a_claim(corpus)
    _subjects(corpus)
    _db_values(corpus)
    _validation(corpus)
    hostile = list(corpus.cases)
    valid = _valid()
    step = max(1, len(hostile) // len(valid))
    out: list[Case] = []
    for index, case in enumerate(hostile):
        out.append(case)
        if index % step == step - 1 and valid:
            key, document = valid.pop(0)
            out.append(Case(key, TENANT, dumps(document), "accepted", VALID, name=document["metadata"]["name"]))
    out += [Case(key, TENANT, dumps(d), "accepted", VALID, name=d["metadata"]["name"]) for key, d in valid]
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), "case ids are unique"
    return tuple(out)


def by_class(cases: Iterable[Case]) -> dict[str, list[Case]]:
    grouped: dict[str, list[Case]] = {k: [] for k in CLASSES}
    for case in cases:
        grouped[case.klass].append(case)
    return grouped


# 60 cases for the live stack, fixed, every class represented (tests/hostile/test_corpus_live.py).
LIVE_SAMPLE = (
    # CEL
    "cel-missing-attr-exactly", "cel-div-zero-first-available", "cel-non-bool-string-mig", "cel-regex-bracket-exactly",
    "cel-type-lt-guarded", "cel-dyn-add-exactly", "cel-int-overflow-add-exactly", "cel-quantity-huge-gt",
    "cel-and-chain-1000-exactly", "cel-not-5000-exactly", "cel-parens-1000-first-available",
    "cel-bind-chain-270-exactly", "cel-syntax-dangling-op", "cel-length-10241-exactly",
    "cel-profile-on-whole-gpus",
    # not a claim
    "nac-list", "nac-null", "nac-number", "nac-string", "nac-empty-object", "nac-metadata-string",
    "nac-spec-list", "nac-nested-1000-lists", "nac-invalid-utf8", "nac-surrogate-annotation", "nac-nul-name",
    "nac-empty-payload", "nac-annotation-1mb", "nac-garbage-8mb", "nac-count-1e9", "nac-requests-10000",
    "nac-selectors-10000",
    # subjects
    "subject-extra-token-submit", "subject-tenant-dollar", "subject-tenant-percent", "subject-tenant-accent",
    "subject-tenant-emoji", "subject-tenant-long-254", "subject-extra-token-release",
    # values a database refuses, releases
    "db-name-254", "db-priority-2147483648", "db-priority-minus-2147483649", "db-priority-arabic-indic",
    "db-priority-underscore", "db-priority-spaces", "db-preemptible-maybe", "release-name-nul",
    "release-number", "release-object", "db-name-253", "release-name-253",
    # validation
    "val-claim-name-upper", "val-request-name-64", "val-duplicate-requests", "val-count-string",
    "val-meta-resource-version", "val-mode-some", "val-unknown-field-request",
    # valid
    "valid-lab-training-gpu", "valid-lab-distributed-training",
)


def live_cases() -> list[Case]:
    """The live sample, in LIVE_SAMPLE's order (a claim is submitted before its release)."""
    by_id = {c.id: c for c in build()}
    return [by_id[i] for i in LIVE_SAMPLE]
