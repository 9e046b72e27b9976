"""Prometheus metrics of the services, served at /metrics by the health server (`serve X` with
CLAIMBROKER_HEALTH_PORT, and `up` with it). One registry per process: each series says which part it
measures by its name, not by a service label. Under `up` the allocator runs in a process of its own and
reports its series to the parent every second (services/runtime/service_process.py), which serves them
beside its own (`merged`).

What an operator watches: how many decisions of each state are written, how long the decision core and the
whole decision transaction take, how deep the queue is per tenant and flavor, how far the allocator's
consumer lags behind the claims stream, how many committed events wait in the outbox, and the notifier's
alerts and webhook failures."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

# Seconds, from a cycle of a few claims (ms) to a deep queue's slow transaction (seconds).
_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

DECISIONS = Counter("claimbroker_decisions", "Claim statuses the allocator committed, by state (Pending, "
                    "Allocated, Rejected, Preempted, Released)", ["state"])
PREEMPTIONS = Counter("claimbroker_preemptions", "Running claims preempted, by rule", ["rule"])
CYCLE_SECONDS = Histogram("claimbroker_cycle_seconds", "Time of the decision core per cycle",
                          buckets=_TIME_BUCKETS)
TRANSACTION_SECONDS = Histogram("claimbroker_transaction_seconds",
                                "Time of a whole decision transaction (read, decide, write, commit)",
                                buckets=_TIME_BUCKETS)
BATCH_MESSAGES = Histogram("claimbroker_batch_messages", "Claim messages decided per transaction",
                           buckets=(0, 1, 4, 16, 64, 128, 256, 512, 1024))
QUEUE_DEPTH = Gauge("claimbroker_queue_depth", "Waiting claims after the last cycle, by tenant and the "
                    "flavor they wait for ('any' when no flavor is named)", ["tenant", "flavor"])
CONSUMER_PENDING = Gauge("claimbroker_consumer_pending_messages",
                         "Messages of the stream not yet delivered to the consumer (its lag)", ["consumer"])
ESTIMATE_ERROR = Gauge("claimbroker_estimate_error_seconds",
                       "Start estimates against actual starts, over the claims allocated in the last day with an "
                       "estimate published: the median and p90 of |start - p50|, of the first and of the last "
                       "estimate published for each", ["estimate", "quantile"])
ESTIMATE_RUN_SECONDS = Histogram("claimbroker_estimate_cpu_seconds",
                                 "CPU time of one start-estimate run of the allocator (its worker thread)",
                                 buckets=_TIME_BUCKETS)
OUTBOX_UNPUBLISHED = Gauge("claimbroker_outbox_unpublished",
                           "Committed events waiting in the outbox to be published")
ALERTS_SENT = Counter("claimbroker_alerts_sent", "Alert messages published by the notifier",
                      ["kind", "severity", "resolved"])
WEBHOOK_FAILURES = Counter("claimbroker_webhook_failures", "Webhook posts that failed for good, by webhook",
                           ["webhook"])
INVENTORY_PUBLISHED = Counter("claimbroker_inventory_published", "Node inventories published by the watcher")


def set_queue_depth(waiting: Iterable[tuple[str, str]]) -> None:
    """Replace the queue-depth series with these (tenant, flavor) pairs, one per waiting claim: tenants
    whose queue emptied disappear instead of staying at their last value."""
    counts = Tally(waiting)
    QUEUE_DEPTH.clear()
    for (tenant, flavor), count in counts.items():
        QUEUE_DEPTH.labels(tenant, flavor).set(count)


def exposition(*others: bytes) -> tuple[bytes, str]:
    """The text format of every metric of this process, with those of `others` (other processes' own
    series, from `own_series`) merged in, and its content type."""
    own = generate_latest()
    return (merged(own, *others) if any(others) else own), CONTENT_TYPE_LATEST


OWN_PREFIX = "claimbroker_"


def own_series() -> bytes:
    """The broker's own families in text format (not the process_ and python_ ones every process has)."""
    families = _families(generate_latest())
    return _render({name: lines for name, lines in families.items() if name.startswith(OWN_PREFIX)})


def merged(*texts: bytes) -> bytes:
    """Several processes' text formats as one: each family once, its samples from every text. A sample (name
    and labels) that several texts have is added up for counters and histograms (each process counts its
    own: a family another process only declares shows zeros), the largest taken for gauges (processes that
    set one read the same thing, such as the outbox's backlog), the earliest for `_created`."""
    result: dict[str, tuple[list[str], dict[str, str]]] = {}
    kinds: dict[str, str] = {}
    for text in texts:
        for name, (header, samples) in _families(text).items():
            kind = next((line.split(" ", 3)[3] for line in header if line.startswith("# TYPE ")), "untyped")
            kinds.setdefault(name, kind)
            kept = result.setdefault(name, (header, {}))[1]
            for key, line in samples.items():
                kept[key] = _combined(kept[key], line, key, kinds[name]) if key in kept else line
    return _render(result)


def _combined(before: str, line: str, key: str, kind: str) -> str:
    try:
        a, b = float(before.rsplit(" ", 1)[1]), float(line.rsplit(" ", 1)[1])
    except (IndexError, ValueError):
        return line
    sample = key.split("{", 1)[0]
    value = min(a, b) if sample.endswith("_created") else max(a, b) if kind == "gauge" else a + b
    return f"{key} {value!r}"


def _families(text: bytes) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Per family (the name of its `# TYPE` line): its comment lines, and its sample lines by name and labels."""
    families: dict[str, tuple[list[str], dict[str, str]]] = {}
    name = ""
    for line in text.decode().splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name = line.split(" ", 3)[2]
            families.setdefault(name, ([], {}))[0].append(line)
        elif line and not line.startswith("#"):
            key = line.rsplit(" ", 1)[0] if "}" not in line else line[:line.rindex("}") + 1]
            families.setdefault(name, ([], {}))[1][key] = line
    return families


def _render(families: dict[str, tuple[list[str], dict[str, str]]]) -> bytes:
    lines = [line for header, samples in families.values() for line in (*header, *samples.values())]
    return ("\n".join(lines) + "\n").encode() if lines else b""
