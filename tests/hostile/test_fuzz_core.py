"""Fuzzing claim documents through read_submission and the decision core (hypothesis).

Documents are ResourceClaim-shaped: the right keys at each level most of the time, each field either a
plausible value or a wrong-typed one, an unknown key now and then, and CEL selectors built from a small
grammar (attributes a device may lack, division, regexes, dyn, cel.bind, comprehensions, truncations).
Property: nothing escapes but InvalidClaim from read_submission; a claim that reads is decided, with a
reason when Rejected or Pending, without an internal error, and a normal claim in its cycle is Allocated.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shared.admission.kept import KeptState
from shared.dra.claims import InvalidClaim, read_submission
from tests.hostile.core import COMPANION, busy_fleet, decide_with_companion
from tests.hostile.corpus import ATTR, GPU, MIG, TENANT

MEMO = KeptState()
RUNNING = busy_fleet(MEMO)

# --- JSON of the wrong kind -----------------------------------------------------------------------------

odd_strings = st.sampled_from(["", " ", "\x00", "\ud800", "é", "😀", "a" * 300, "true", "1", "-1", "null",
                               "gpu.nvidia.com", "ExactCount", "All", "t1", "t2", ">", "*", "a.b"])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 33, 2**31, 2**63, 10**9]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12), odd_strings,
)
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6) | odd_strings, inner, max_size=3), max_leaves=8)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], bad_share: int) -> st.SearchStrategy[Any]:
    """`good`, but one time in `bad_share` a draw from `bad` (shrinking goes towards `good`)."""
    return st.integers(0, bad_share - 1).flatmap(lambda roll: bad if roll == bad_share - 1 else good)


def either(good: st.SearchStrategy[Any], bad_share: int = 40) -> st.SearchStrategy[Any]:
    """Mostly `good`, one time in `bad_share` a value of any kind."""
    return mostly(good, junk, bad_share)


# --- CEL from a small grammar -----------------------------------------------------------------------------

atoms = st.sampled_from([
    "device.driver", f"{ATTR}.productName", f"{ATTR}.profile", f'{ATTR}["numa-node"]', f"{ATTR}.type",
    f"{ATTR}.cudaComputeCapability", f'device.capacity["{GPU}"].memory', 'device.attributes["x.io"].y',
    "1", "0", "-1", "9223372036854775807", "1.5", '"H100"', '"A100"', '"["', '"(a*)*b"', "true", "false", "null",
    "[1, 2]", '{"a": 1}', 'quantity("1Gi")', 'quantity("80Gi")', 'quantity("x")', 'semver("1.2.3")', "x",
])
binary = st.sampled_from(["==", "!=", "<", ">=", "&&", "||", "+", "-", "*", "/", "%", "in"])
methods = st.sampled_from(["matches", "contains", "startsWith", "endsWith", "compareTo", "isGreaterThan",
                           "isLessThan", "exists", "all"])


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, binary, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["!", "-", "!!"]), inner).map("".join),
        st.tuples(inner, methods, inner).map(lambda t: f"{t[0]}.{t[1]}({t[2]})"),
        st.tuples(st.sampled_from(["dyn", "size", "int", "string", "has", "quantity", "isQuantity"]), inner)
        .map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"cel.bind(x, {t[0]}, {t[1]})"),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        inner.map(lambda e: f"[1, 2, 3].all(i, {e})"),
        inner.map(lambda e: f"{ATTR}.?profile.orValue({e})"),
    )


cel = st.recursive(atoms, _extend, max_leaves=8)
expressions = st.one_of(
    cel, cel, cel.map(lambda e: e[: len(e) // 2]), cel.map(lambda e: "(" * 300 + e + ")" * 300),
    st.tuples(cel, st.integers(2, 400)).map(lambda t: " && ".join([t[0]] * t[1])),
)

# --- ResourceClaim-shaped documents --------------------------------------------------------------------

names = mostly(st.sampled_from(["gpu", "a", "b", "one"]), st.sampled_from(["GPU", "g_pu", "-x", "g" * 64, "", "a/b"])
               | junk, 40)
selectors = st.lists(either(st.fixed_dictionaries({"cel": either(st.fixed_dictionaries({
    "expression": either(expressions, 20)}))})), max_size=3)


def with_unknown_field(document: dict[str, Any]) -> dict[str, Any]:
    return {**document, "bogusField": True}


def body(subrequest: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """An exactly request or a firstAvailable subrequest: valid keys with mostly valid values, now and then
    an unknown key."""
    optional: dict[str, st.SearchStrategy[Any]] = {
        "count": mostly(st.integers(1, 4), st.integers(-2, 40) | junk, 20),
        "allocationMode": either(st.sampled_from(["ExactCount", "ExactCount", "All"])),
        "selectors": either(selectors),
        "tolerations": either(st.lists(st.fixed_dictionaries({"operator": st.sampled_from(["Exists", "Equal"])},
                                                              optional={"key": st.text(max_size=5)}), max_size=2)),
        "capacity": either(st.fixed_dictionaries({"requests": st.dictionaries(
            st.sampled_from(["memory", "gpu.nvidia.com/memory"]), st.sampled_from(["1Gi", "40Gi", "x"]))})),
    }
    required = {"deviceClassName": mostly(st.sampled_from([GPU, GPU, MIG]), st.sampled_from(["tpu.example.com", ""])
                                          | junk, 30)}
    if subrequest:
        required["name"] = names
    else:
        optional["adminAccess"] = either(st.booleans())
    plain = st.fixed_dictionaries(required, optional=optional)
    return mostly(plain, plain.map(with_unknown_field), 40)


def named_list(item: st.SearchStrategy[Any], max_size: int) -> st.SearchStrategy[list[Any]]:
    """A list of named items, names unique but now and then."""
    unique = st.lists(item, min_size=1, max_size=max_size,
                      unique_by=lambda x: repr(x.get("name")) if isinstance(x, dict) else repr(x))
    return mostly(unique, st.lists(item, min_size=1, max_size=max_size), 20)


requests = mostly(st.one_of(
    st.fixed_dictionaries({"name": names, "exactly": either(body())}),
    st.fixed_dictionaries({"name": names, "firstAvailable": either(named_list(body(subrequest=True), 3))}),
), st.fixed_dictionaries({"name": names, "exactly": body(), "firstAvailable": st.lists(body(subrequest=True))})
    | junk, 40)
attributes = st.sampled_from(["gpu.nvidia.com/numa-node", "gpu.nvidia.com/productName", "gpu.nvidia.com/x",
                              "resource.kubernetes.io/pcieRoot", "not a name"])
constraints = st.lists(either(st.one_of(
    st.fixed_dictionaries({"matchAttribute": attributes}, optional={"requests": st.lists(names, max_size=2)}),
    st.fixed_dictionaries({"distinctAttribute": attributes}, optional={"requests": st.lists(names, max_size=2)}),
    st.fixed_dictionaries({}, optional={"matchAttribute": attributes, "distinctAttribute": attributes}),
)), max_size=2)
parameters = either(st.dictionaries(st.sampled_from(["a", "b"]), junk), 10)
configs = st.lists(either(st.fixed_dictionaries(
    {"opaque": either(st.fixed_dictionaries({"driver": either(st.just(GPU)), "parameters": parameters}))},
    optional={"requests": st.lists(names, max_size=2)})), max_size=2)
devices = st.fixed_dictionaries({"requests": either(named_list(requests, 3))},
                                optional={"constraints": either(constraints), "config": either(configs)})
broker_annotations = st.fixed_dictionaries({}, optional={
    "claimbroker.io/priority": mostly(st.sampled_from(["0", "10", "-5", "2147483647", "-2147483648"]),
                                      st.sampled_from(["2147483648", "٣", " 5 ", "1_000", "maybe"]) | junk, 10),
    "claimbroker.io/preemptible": mostly(st.sampled_from(["true", "false"]), st.sampled_from(["maybe", "0"]) | junk,
                                         10),
    "note": either(st.text(max_size=20)),
})
metadata = st.fixed_dictionaries(
    {"name": mostly(st.from_regex(r"\Ac-[a-z0-9]{1,8}\Z"), st.sampled_from(["UPPER", "a.b", "n" * 254]) | junk, 40)},
    optional={"namespace": mostly(st.sampled_from([TENANT, ""]), st.just("t2") | junk, 40),
              "annotations": either(broker_annotations),
              "uid": st.text(max_size=5)})
plain_documents = st.fixed_dictionaries(
    {"apiVersion": either(st.just("resource.k8s.io/v1"), 60), "kind": either(st.just("ResourceClaim"), 60),
     "metadata": either(metadata), "spec": either(st.fixed_dictionaries({"devices": either(devices)}))},
)
documents = mostly(plain_documents, plain_documents.map(with_unknown_field)
                   | st.tuples(plain_documents, junk).map(lambda t: {**t[0], "status": t[1]}), 40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(documents)
def test_claim_shaped_documents_never_escape_and_never_poison_a_cycle(document: dict[str, Any]) -> None:
    payload = json.dumps(document).encode()  # \ud800 and NUL travel as JSON escapes, as a hostile client sends
    try:
        claim = read_submission(payload, TENANT)
    except InvalidClaim as invalid:
        assert str(invalid)
        event("refused by read_submission")
        return
    if claim.metadata.name == COMPANION:
        return
    answer = decide_with_companion(claim, MEMO, RUNNING)
    event(f"decided: {answer['outcome']}")
    assert answer["outcome"] in ("allocated", "pending", "rejected"), answer
    assert not answer["problems"], answer["problems"]
    assert answer["companion"] == "Allocated", answer
