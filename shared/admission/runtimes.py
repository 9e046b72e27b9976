"""How long claims run once Allocated, for the start estimates (issue 39): a claim's
claimbroker.io/expected-runtime, else its tenant's observed runtimes as quantiles (shared/admission/
estimate_publishing.runtimes_from works them out of the ledger's history), and when a running claim ends
given how long it has run already."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import NormalDist


@dataclass(frozen=True)
class Quantiles:
    """Runtimes in seconds."""

    p50: float
    p90: float

    def end(self, since: float, now: float, *, upper: bool) -> float:
        """When a claim allocated at `since` and still running at `now` ends, in the p50 run (or the p90 run,
        `upper`): the median (p90) of its runtime given that it has run this long, taking runtimes as a
        lognormal through p50 and p90. Unconditioned, a claim past the tenant's observed p50 would end at
        once and every estimate behind it say 'now' (bench/bench_eta_accuracy.py measured the error as large
        as the waits). One runtime (an expected-runtime annotation, p50 == p90) is taken as it is: at its end,
        never before now."""
        seconds = self.p90 if upper else self.p50
        elapsed = now - since
        if elapsed <= 0 or not 0 < self.p50 < self.p90:
            return max(now, since + seconds)
        mu = math.log(self.p50)
        sigma = (math.log(self.p90) - mu) / _Z90
        done = _NORMAL.cdf((math.log(elapsed) - mu) / sigma)  # of such runs, the share over by now
        target = min(done + (0.9 if upper else 0.5) * (1.0 - done), _MOST)
        return max(now, since + math.exp(mu + sigma * _NORMAL.inv_cdf(target)))


_NORMAL = NormalDist()
_Z90 = _NORMAL.inv_cdf(0.9)
_MOST = 1.0 - 1e-9  # a quantile short of 1: inv_cdf(1) is infinite


@dataclass(frozen=True)
class Runtimes:
    """How long claims run once Allocated, where their claimbroker.io/expected-runtime does not say: observed
    quantiles per (tenant, flavor) and per tenant (the shell works them out of the ledger's history), else
    `default` (None: unknown, and a running claim of unknown runtime never ends within the estimate)."""

    by_flavor: Mapping[tuple[str, str], Quantiles] = field(default_factory=dict)
    by_tenant: Mapping[str, Quantiles] = field(default_factory=dict)
    default: Quantiles | None = None

    def of(self, tenant: str, flavors: Iterable[str | None], expected: float | None) -> Quantiles | None:
        """A claim's runtime: its expected runtime, else what its tenant's claims ran on a flavor it holds
        (the longest of those known), else what its tenant's ran, else the default."""
        if expected is not None:
            return Quantiles(expected, expected)
        if self.by_flavor:
            known = [q for f in flavors if f is not None and (q := self.by_flavor.get((tenant, f))) is not None]
            if known:
                return max(known, key=lambda q: (q.p50, q.p90))
        return self.by_tenant.get(tenant, self.default)
