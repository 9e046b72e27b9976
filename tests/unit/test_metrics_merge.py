"""`up` serves its other processes' Prometheus series beside its own (services/runtime/metrics.merged): each
family once, samples from all; counters and histograms added up, the largest of a gauge."""

from __future__ import annotations

import pytest

from services.runtime.metrics import merged

PARENT = b"""# HELP claimbroker_consumer_pending_messages lag
# TYPE claimbroker_consumer_pending_messages gauge
claimbroker_consumer_pending_messages{consumer="notifier"} 3.0
# HELP claimbroker_outbox_unpublished waiting
# TYPE claimbroker_outbox_unpublished gauge
claimbroker_outbox_unpublished 0.0
# HELP process_cpu_seconds_total cpu
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
"""
CHILD = b"""# HELP claimbroker_consumer_pending_messages lag
# TYPE claimbroker_consumer_pending_messages gauge
claimbroker_consumer_pending_messages{consumer="allocator"} 7.0
# HELP claimbroker_outbox_unpublished waiting
# TYPE claimbroker_outbox_unpublished gauge
claimbroker_outbox_unpublished 4.0
# HELP claimbroker_decisions_total decisions
# TYPE claimbroker_decisions_total counter
claimbroker_decisions_total{state="Allocated"} 2.0
claimbroker_decisions_total{state="Pending"} 5.0
"""
THIRD = b"""# HELP claimbroker_decisions_total decisions
# TYPE claimbroker_decisions_total counter
claimbroker_decisions_total{state="Pending"} 0.0
# HELP claimbroker_transaction_seconds time
# TYPE claimbroker_transaction_seconds histogram
claimbroker_transaction_seconds_count 0.0
"""


@pytest.mark.parametrize(("line", "times"), [
    ("# TYPE claimbroker_consumer_pending_messages gauge", 1),  # one family, declared once
    ('claimbroker_consumer_pending_messages{consumer="notifier"} 3.0', 1),  # samples of both processes
    ('claimbroker_consumer_pending_messages{consumer="allocator"} 7.0', 1),
    ("claimbroker_outbox_unpublished 4.0", 1),  # the same gauge: the largest
    ("claimbroker_outbox_unpublished 0.0", 0),
    ('claimbroker_decisions_total{state="Pending"} 5.0', 1),  # a counter: added up (a declared zero adds none)
    ("claimbroker_transaction_seconds_count 0.0", 1),
    ('claimbroker_decisions_total{state="Allocated"} 2.0', 1),  # a family only the child has
    ("process_cpu_seconds_total 1.5", 1),
])
def test_merged_keeps_each_family_once_with_every_sample(line: str, times: int) -> None:
    assert merged(PARENT, CHILD, THIRD).decode().splitlines().count(line) == times


def test_counters_of_several_processes_add_up() -> None:
    assert 'claimbroker_decisions_total{state="Pending"} 10.0' in merged(CHILD, CHILD).decode().splitlines()


def test_samples_stay_under_their_family() -> None:
    lines = merged(PARENT, CHILD).decode().splitlines()
    family = lines.index("# TYPE claimbroker_consumer_pending_messages gauge")
    assert lines[family + 1:family + 3] == ['claimbroker_consumer_pending_messages{consumer="notifier"} 3.0',
                                            'claimbroker_consumer_pending_messages{consumer="allocator"} 7.0']
