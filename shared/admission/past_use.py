"""Past use for fair sharing over time (contract, Quotas: `fairSharing.halfLife`): per tenant and flavor,
the GPU units it held averaged over time with exponential decay of the half-life. Pure functions; time
is an input (the caller's `now`), and the shell keeps the figures (the ledger, so they survive restarts).

- Units are GPU units (devices times their flavor's `value`), as shares count them: a tenant that held
  8 units for several half-lives has a past use near 8; one half-life after it released them, near 4.
- Each step is Kueue's Admission Fair Sharing update, usage = f * previous + (1 - f) * in use, with
  f = 0.5 ** (elapsed / half-life): exact for any step length while what is in use stayed the same over
  it, so the shell may step at every cycle or after a restart's gap alike.
- An admission adds its expected use at once (the entry penalty, as Kueue's AFS does): the past use one
  ENTRY_PENALTY_SECONDS of holding it would add, so a burst of one tenant is ordered behind others within
  the cycle that admits it, before any time has passed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from shared.admission.flavors import Flavors
from shared.admission.model import Running
from shared.dra.inventory import Fleet

PastUse = Mapping[tuple[str, str], float]  # (tenant, flavor) -> GPU units
ENTRY_PENALTY_SECONDS = 300.0  # Kueue's usageSamplingInterval default: one sampling step of holding
NEGLIGIBLE = 1e-9  # GPU units below which a past use is dropped (it halves away to nothing)


def decay_factor(elapsed: float, half_life: float) -> float:
    """The weight the previous past use keeps after `elapsed` seconds (1.0 with no time or no half-life)."""
    if half_life <= 0 or elapsed <= 0:
        return 1.0
    return math.pow(0.5, elapsed / half_life)


def advance_past_use(previous: PastUse, in_use: PastUse, elapsed: float,
                     half_life: float) -> dict[tuple[str, str], float]:
    """Past use `elapsed` seconds later, with `in_use` held all along: each (tenant, flavor) moves from its
    previous value towards what it holds, by 1 - 0.5 ** (elapsed / half_life). With no half-life there is
    no past use ({}). Figures that have decayed below NEGLIGIBLE are dropped."""
    if half_life <= 0:
        return {}
    keep = decay_factor(elapsed, half_life)
    gain = 1.0 - keep
    out: dict[tuple[str, str], float] = {}
    # in the inputs' order (not a set's, which varies between processes): per-tenant sums, and so the
    # order of tenants whose shares tie, come out the same in every run
    for key in [*previous, *(k for k in in_use if k not in previous)]:
        value = previous.get(key, 0.0) * keep + in_use.get(key, 0.0) * gain
        if value > NEGLIGIBLE:
            out[key] = value
    return out


def bring_up_to(previous: PastUse, since: float | None, in_use: PastUse, now: float,
                half_life: float) -> dict[tuple[str, str], float]:
    """The shell's one call per step: past use kept at `since` (None: never kept) brought up to `now`, with
    `in_use` held since then. A clock that went back steps nothing. The shell steps at every cycle and
    whenever claims end between cycles, so that use is counted while it is held (kueue#15383)."""
    if half_life <= 0:
        return {}
    if since is None:
        return dict(previous)
    return advance_past_use(previous, in_use, max(0.0, now - since), half_life)


def entry_penalty(units: float, half_life: float) -> float:
    """The past use an admission of `units` GPU units adds at once: what ENTRY_PENALTY_SECONDS of holding them
    would add to a past use of 0."""
    if half_life <= 0:
        return 0.0
    return units * (1.0 - decay_factor(ENTRY_PENALTY_SECONDS, half_life))


def halves_in(past: float, in_use: float, half_life: float) -> float | None:
    """Seconds until the tenant's past use is half of what it is now, if it holds `in_use` meanwhile
    ("halves in", for the usage page); None when it never gets there (it holds half of it or more)."""
    if half_life <= 0 or past <= NEGLIGIBLE or in_use >= past / 2:
        return None
    # past * f + in_use * (1 - f) = past / 2  =>  f = (past / 2 - in_use) / (past - in_use)
    return half_life * math.log2((past - in_use) / (past / 2 - in_use))


def units_in_use(fleet: Fleet, running: Iterable[Running], flavors: Flavors) -> dict[tuple[str, str], float]:
    """GPU units each tenant holds per flavor: what a step of `advance_past_use` adds. Devices no flavor
    counts weigh nothing (as shares count them), and devices the fleet no longer has count nothing."""
    out: dict[tuple[str, str], float] = {}
    by_key = fleet.by_key
    for claim in running:
        for key in claim.allocation.keys:
            device = by_key.get(key)
            flavor = flavors.of(device) if device is not None else None
            if flavor is None:
                continue
            slot = (claim.tenant, flavor.name)
            out[slot] = out.get(slot, 0.0) + flavor.value
    return out


def per_tenant(past: PastUse) -> dict[str, float]:
    """Past use per tenant, over its flavors: what its share adds to its units in use."""
    out: dict[str, float] = {}
    for (tenant, _), units in past.items():
        out[tenant] = out.get(tenant, 0.0) + units
    return out
