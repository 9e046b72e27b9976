"""The services' collector pacing: what a cycle keeps is frozen; reference cycles wait for a full pass."""

from __future__ import annotations

import gc
import weakref

from services.runtime.gc_tuning import CollectorPacing


class _Node:
    me: _Node


def test_what_a_cycle_keeps_is_frozen_and_reference_cycles_are_collected_when_a_full_pass_is_due() -> None:
    now = [0.0]
    pacing = CollectorPacing(full_every_s=10, clock=lambda: now[0])
    gc.unfreeze()
    try:
        node = _Node()
        node.me = node  # a reference cycle: only the cyclic collector frees it
        alive = weakref.ref(node)
        del node
        pacing.after_cycle()
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert alive() is not None  # frozen: the collector's passes skip it
        now[0] = 9.0
        pacing.after_cycle()
        gc.collect()
        assert alive() is not None  # no full pass due yet
        now[0] = 10.0
        pacing.after_cycle()
        assert alive() is None  # the full pass came due: the cycle is freed
        assert gc.get_freeze_count() > 0  # and what lives on is frozen again
    finally:
        gc.unfreeze()
