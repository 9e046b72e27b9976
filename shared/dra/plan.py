"""A claim prepared for placement once per spec: its requests with their class and request selectors compiled,
and its firstAvailable alternatives in order.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shared.dra import v1 as dra
from shared.dra.budget import Meter
from shared.dra.cel import SelectorError, SelectorText, compile_selector, selector_text
from shared.dra.results import Rejected

MAX_VARIANTS = 256  # firstAvailable combinations tried across nodes, in order


@dataclass(frozen=True)
class Alternative:
    """One way to satisfy a request: the request itself, or one firstAvailable subrequest."""

    result_name: str
    parent: str
    class_name: str
    body: dra.ExactDeviceRequest | dra.DeviceSubRequest
    expressions: tuple[str, ...]  # class selectors first, then the request's: compiled when an index is built
    admin_access: bool

    @property
    def all_mode(self) -> bool:
        return self.body.allocation_mode == "All"

    @property
    def wanted(self) -> int:
        """Devices needed at least (All mode: one, and then every match on the node)."""
        return 1 if self.all_mode else self.body.wanted

    @cached_property
    def selectors(self) -> tuple[SelectorText, ...]:
        """A plan keeps its selectors' text only (a compiled program is about 25 KB): they are compiled
        from the bounded compile cache when a device's result is not memoised yet."""
        return tuple(selector_text(e) for e in self.expressions)

    @cached_property
    def _selector_key(self) -> tuple[Any, ...]:
        return (self.expressions, self.body.tolerations)

    def index_key(self, group_attribute: str | None = None) -> tuple[Any, ...]:
        return (*self._selector_key, group_attribute)


@dataclass(frozen=True)
class Plan:
    """A claim made ready to decide: compiled selectors per alternative, its constraints, and the
    concrete variants (one alternative per request) in the order firstAvailable prefers them."""

    requests: tuple[tuple[str, tuple[Alternative, ...]], ...]
    constraints: tuple[dra.DeviceConstraint, ...]
    variants: tuple[tuple[Alternative, ...], ...]
    more_variants: bool  # firstAvailable allowed more combinations than MAX_VARIANTS

    @cached_property
    def admin_access(self) -> bool:
        """Some request asks for monitoring access to devices that others may hold."""
        return any(a.admin_access for _, alternatives in self.requests for a in alternatives)

    def search_shape(self, variant: Sequence[Alternative], indexes: Sequence[Any]) -> tuple[Any, ...]:
        """What a search of the variant on one node depends on besides the node's state: per request, the
        index its candidates come from, how many it wants and how, and which constraints bind it. Two
        variants of one shape find the same on any node (firstAvailable subrequests whose selectors accept
        the same devices are searched once)."""
        terms = self._search_terms
        return tuple((id(index), terms[a.result_name]) for a, index in zip(variant, indexes, strict=True))

    @cached_property
    def _search_terms(self) -> dict[str, tuple[Any, ...]]:
        """Per alternative: how it asks (All mode, admin access, how many) and which constraints bind it."""
        terms = {}
        for _, alternatives in self.requests:
            for a in alternatives:
                parent = a.parent
                binding = tuple(not c.requests or a.result_name in c.requests or parent in c.requests
                                for c in self.constraints)
                terms[a.result_name] = (a.all_mode, a.admin_access, a.wanted, binding)
        return terms

    def group_attribute(self, variant: Sequence[Alternative]) -> str | None | bool:
        """For a single-request variant, the one matchAttribute to group by (None: no constraint); False
        when the variant needs the general search."""
        if len(variant) != 1 or variant[0].admin_access or variant[0].all_mode:
            return False
        name = variant[0].result_name
        attribute: str | None = None
        for c in self.constraints:
            if c.requests and name not in c.requests and name.split("/", 1)[0] not in c.requests:
                continue
            if c.distinct_attribute is not None or attribute is not None:
                return False
            attribute = c.match_attribute
        return attribute


def prepare(claim: dra.ResourceClaim, classes: Mapping[str, dra.DeviceClass], meter: Meter | None = None) -> Plan:
    """Compile and check a claim once; raises Rejected with the reason a person can act on, and
    BudgetExceeded when compiling its selectors costs more than `meter` has left (what was compiled stays
    cached: the next try goes on from there)."""
    requests = claim.spec.devices.requests
    if not requests:
        raise Rejected("claim has no device requests")
    if len(requests) > dra.MAX_REQUESTS:
        raise Rejected(f"claim has {len(requests)} requests, over the limit of {dra.MAX_REQUESTS}")
    prepared: list[tuple[str, tuple[Alternative, ...]]] = []
    minimum_devices = 0
    for request in requests:
        bodies: list[tuple[str, dra.ExactDeviceRequest | dra.DeviceSubRequest, bool]]
        if request.exactly is not None:
            bodies = [(request.name, request.exactly, bool(request.exactly.admin_access))]
        else:
            bodies = [(f"{request.name}/{sub.name}", sub, False) for sub in request.first_available or ()]
        alternatives = []
        for result_name, body, admin in bodies:
            device_class = classes.get(body.device_class_name)
            if device_class is None:
                raise Rejected(
                    f"request {result_name!r}: unknown device class {body.device_class_name!r}; "
                    f"known classes: {', '.join(sorted(classes))}"
                )
            expressions = []
            for origin, selector in [("class", s) for s in device_class.spec.selectors] + [
                ("request", s) for s in body.selectors
            ]:
                try:
                    compile_selector(selector.cel.expression, meter)
                except SelectorError as error:
                    raise Rejected(f"request {result_name!r}: {origin} selector: {error}") from None
                expressions.append(selector.cel.expression)
            alternatives.append(
                Alternative(result_name, request.name, body.device_class_name, body, tuple(expressions), admin)
            )
        first = alternatives[0]
        minimum_devices += first.wanted
        if all(not a.all_mode and a.body.wanted > dra.MAX_DEVICES_PER_CLAIM for a in alternatives):
            raise Rejected(
                f"request {request.name!r} asks for {first.body.wanted} devices, over the claim limit of "
                f"{dra.MAX_DEVICES_PER_CLAIM}"
            )
        prepared.append((request.name, tuple(alternatives)))
    if minimum_devices > dra.MAX_DEVICES_PER_CLAIM:
        raise Rejected(
            f"claim asks for at least {minimum_devices} devices, over the claim limit of {dra.MAX_DEVICES_PER_CLAIM}"
        )
    names = {name for name, _ in prepared} | {a.result_name for _, alts in prepared for a in alts}
    for constraint in claim.spec.devices.constraints:
        unknown = [r for r in constraint.requests if r not in names]
        if unknown:
            raise Rejected(f"constraint names request {unknown[0]!r}, which the claim does not have")
    variants = tuple(itertools.islice(itertools.product(*(alts for _, alts in prepared)), MAX_VARIANTS + 1))
    return Plan(tuple(prepared), claim.spec.devices.constraints, variants[:MAX_VARIANTS],
                len(variants) > MAX_VARIANTS)


def spec_key(claim: dra.ResourceClaim) -> bytes:
    """A digest of the spec as JSON: equal specs serialise alike, and pydantic-core writes it in compiled
    code, several times faster than hashing and comparing the nested models field by field in Python (and
    it also covers opaque parameters, which hold unhashable dicts). The digest, not the JSON, is what the
    plan memo keeps: a spec may be 1 MiB of text."""
    return hashlib.blake2b(claim.spec.model_dump_json().encode(), digest_size=20).digest()
