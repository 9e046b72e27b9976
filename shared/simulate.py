"""Offline waves through the same decision core the allocator runs (claimbroker simulate)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared import dra
from shared.allocation import Decision, SelectorMemo, State, settle
from shared.claims import InvalidClaim, settings_of, with_namespace
from shared.inventory import Fleet


@dataclass(frozen=True)
class ClaimOutcome:
    namespace: str
    name: str
    decision: Decision

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": d.state.value,
            "allocation": d.allocation.to_json() if d.allocation else None,
            "reason": d.reason,
        }


def read_claim_document(document: Any, default_tenant: str) -> dra.ResourceClaim | InvalidClaim:
    """A claim, or the reason it is not one (an invalid claim is Rejected, it does not stop the run)."""
    name = None
    if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
        name = document["metadata"].get("name")
        namespace = document["metadata"].get("namespace") or default_tenant
    else:
        namespace = default_tenant
    try:
        claim = dra.parse_claim(with_namespace(document, default_tenant) if isinstance(document, dict) else document)
        settings_of(claim)
        return claim
    except (dra.DocumentError, InvalidClaim) as error:
        return InvalidClaim(str(error), name=name if isinstance(name, str) else None, namespace=namespace)


def run_waves(
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
    waves: Sequence[Sequence[dra.ResourceClaim | InvalidClaim]],
) -> list[ClaimOutcome]:
    """Each wave arrives at once and is settled; claims still pending from earlier waves try again first."""
    memo = SelectorMemo()
    final: dict[tuple[str, str], ClaimOutcome] = {}
    pending: list[dra.ResourceClaim] = []
    in_use: set[tuple[str, str, str]] = set()
    for index, wave in enumerate(waves):
        arrivals = []
        for position, item in enumerate(wave):
            if isinstance(item, InvalidClaim):
                key = (item.namespace or "default", item.name or f"wave-{index + 1}-document-{position + 1}")
                final[key] = ClaimOutcome(key[0], key[1], Decision(State.REJECTED, reason=str(item)))
            else:
                arrivals.append(item)
        outcomes = settle(pending + arrivals, fleet, classes, in_use, memo=memo)
        pending = []
        for outcome in outcomes:
            claim = outcome.claim
            key = (claim.metadata.namespace or "default", claim.metadata.name)
            final[key] = ClaimOutcome(key[0], key[1], outcome.decision)
            if outcome.decision.state is State.PENDING:
                pending.append(claim)
            elif outcome.decision.allocation is not None:
                in_use.update(outcome.decision.allocation.keys)
    return list(final.values())
