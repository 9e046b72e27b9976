"""The services' FastStream apps, on FastStream's test broker (no JetStream semantics: only that a payload
reaches the right handler as the right type, and that one the model refuses is dropped with a warning)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from faststream.nats import TestNatsBroker

from services.allocator.app import allocator_app
from services.allocator.service import Allocator
from services.notifier.app import notifier_app
from services.notifier.service import Notifier
from services.watcher.files import node_payloads
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.fleet.sources import load_inventory
from shared.ledger.engine import create_engine
from shared.settings import BrokerSettings

URL = "nats://127.0.0.1:1"  # never dialled: the test broker stands in


def built_in_fleet() -> dict[str, dict]:  # type: ignore[type-arg]
    return node_payloads(load_inventory([]), sequence=1, observed_at=1.0)


async def test_the_allocator_app_routes_each_node_inventory_to_its_fleet() -> None:
    allocator = Allocator(create_engine("sqlite+aiosqlite://"), BUILTIN_CLASSES)
    app = allocator_app(URL, allocator)
    payloads = built_in_fleet()
    async with TestNatsBroker(app.broker) as broker:
        for node, payload in payloads.items():
            await broker.publish(payload, subjects.inventory(node))
    assert set(allocator.fleet.nodes) == set(payloads)
    assert await allocator.wait_for_inventory(1)


async def test_the_notifier_app_routes_inventory_to_its_rules(tmp_path: Path) -> None:
    notifier = Notifier(create_engine("sqlite+aiosqlite://"), BrokerSettings(data_dir=tmp_path).notifier)
    app = notifier_app(URL, notifier)
    node, payload = next(iter(built_in_fleet().items()))
    async with TestNatsBroker(app.broker) as broker:
        await broker.publish({**payload, "removed": True, "slices": []}, subjects.inventory(node))
    assert notifier.handled == 1


@pytest.mark.parametrize("payload", [b"not json", {"node": "n1"}, {"node": 7, "sequence": "x"}])
async def test_an_inventory_the_model_refuses_is_dropped_with_a_warning(
    payload: object, caplog: pytest.LogCaptureFixture
) -> None:
    allocator = Allocator(create_engine("sqlite+aiosqlite://"), BUILTIN_CLASSES)
    app = allocator_app(URL, allocator)
    good_node, good = next(iter(built_in_fleet().items()))
    with caplog.at_level(logging.WARNING):
        async with TestNatsBroker(app.broker) as broker:
            await broker.publish(payload, subjects.inventory("n1"))
            await broker.publish(good, subjects.inventory(good_node))  # the subscriber goes on
    assert set(allocator.fleet.nodes) == {good_node}
    assert any("does not match its payload model" in r.getMessage() for r in caplog.records)


async def test_a_heartbeat_keeps_the_fleet_and_a_change_replaces_it() -> None:
    """An unchanged node republished (the watcher's heartbeat) only says it is alive: the fleet stays the
    same object, so the cycle's indexes stay valid; a changed node makes a new fleet and a cycle."""
    now = [1_000.0]
    allocator = Allocator(create_engine("sqlite+aiosqlite://"), BUILTIN_CLASSES, inventory_ttl=90.0,
                          clock=lambda: now[0])
    app = allocator_app(URL, allocator)
    node, payload = next(iter(built_in_fleet().items()))
    async with TestNatsBroker(app.broker) as broker:
        await broker.publish({**payload, "sequence": 1, "observedAtUnix": 1_000.0}, subjects.inventory(node))
        fleet = allocator.fleet
        allocator.inventory.changed.clear()
        await broker.publish({**payload, "sequence": 2, "observedAtUnix": 1_030.0}, subjects.inventory(node))
        assert allocator.fleet is fleet and not allocator.inventory.changed.is_set()
        now[0] = 1_200.0
        assert node in allocator.inventory.unusable_nodes()  # last heard at 1,030: over the TTL
        await broker.publish({**payload, "sequence": 3, "observedAtUnix": 1_200.0}, subjects.inventory(node))
        assert allocator.fleet is fleet and allocator.inventory.changed.is_set()  # back: waiting claims may fit
        assert allocator.inventory.unusable_nodes() == {}
        await broker.publish({**payload, "sequence": 1, "observedAtUnix": 900.0, "slices": []},
                             subjects.inventory(node))
        assert allocator.fleet is fleet  # an older snapshot arriving late changes nothing
        await broker.publish({**payload, "sequence": 4, "observedAtUnix": 1_210.0, "labels": {"zone": "b"}},
                             subjects.inventory(node))
        assert allocator.fleet is not fleet and allocator.fleet.nodes[node].labels == {"zone": "b"}
