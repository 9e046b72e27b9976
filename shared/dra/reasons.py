"""Why a claim waits, in numbers a person can act on.

Per request: what it asked, how many devices of the fleet its selectors accept, how many of those are
free, and what holds the rest (use, taints, shared counters, health, stale inventory, a constraint).
A claim no device of today's fleet could ever satisfy says so, with the closest device or a
did-you-mean for an equality selector that matches nothing. Read from the indexes: no fleet scan,
except for the hints of a claim that nothing matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from shared.dra import v1 as dra
from shared.dra.budget import STEP, Meter
from shared.dra.cel import SelectorError, SelectorText, selector_text
from shared.dra.fleet_index import DeviceIndex
from shared.dra.inventory import Fleet, FleetDevice
from shared.dra.matching import SelectorMemo
from shared.dra.plan import Alternative, Plan

MAX_PARTS = 4  # requests and alternatives a reason names; a status stays a sentence, not a report
_EQUALITY = re.compile(r"""attributes\[\s*["']([^"']+)["']\s*\]\s*\.\s*([A-Za-z_][\w-]*)\s*==\s*["']([^"']*)["']""")
_HELD = (("stale inventory", "on nodes with stale inventory"), ("unhealthy", "unhealthy"),
         ("shared counters", "blocked by shared counters (a GPU and its MIG partitions exclude each other)"))


class FleetView(Protocol):
    """What a reason reads of the fleet's state (shared.dra.allocation.FleetState)."""

    fleet: Fleet
    classes: Mapping[str, dra.DeviceClass]
    memo: SelectorMemo
    meter: Meter
    hints: dict[Any, str]  # per kind of request: hints depend on the fleet only

    def index(self, alternative: Alternative, group_attribute: str | None = None) -> DeviceIndex: ...


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _held_back(index: DeviceIndex) -> str:
    blocked = index.blocked.copy()
    blocked["unhealthy"] += index.unhealthy  # marked by telemetry: out of the index from the start
    parts = [f"{blocked[why]} {text}" for why, text in _HELD if blocked[why]]
    if index.tainted:
        parts.append(f"{index.tainted} held back by taints it does not tolerate")
    return f" ({', '.join(parts)})" if parts else ""


def _label(state: FleetView, alternative: Alternative) -> str:
    resource = state.classes[alternative.class_name].spec.extended_resource_name
    return f"Insufficient {resource}" if resource else f"Insufficient {alternative.class_name} devices"


def _hint(state: FleetView, kind: str, alternative: Alternative) -> str:
    """Hints scan the fleet, so each is worked out once per kind of request and fleet state."""
    key = (kind, alternative.index_key())
    found = state.hints.get(key)
    if found is None:
        found = state.hints[key] = (_did_you_mean if kind == "did-you-mean" else _closest)(state, alternative)
    return found


def _did_you_mean(state: FleetView, alternative: Alternative) -> str:
    """For `productName == "H100"` against a fleet that says "NVIDIA H100 80GB HBM3", show what exists among
    the devices the claim's class accepts: a value only devices of another class have (the MIG slices of an
    H100 for a gpu.nvidia.com claim) is no answer, and where it is, that class is named."""
    hints = []
    device_class = state.classes.get(alternative.class_name)
    own = len(device_class.spec.selectors) if device_class is not None else 0
    devices = _accepted(state, alternative.selectors[:own])
    for expression in alternative.expressions[own:]:  # the request's own: the class's hold by definition
        for domain, name, wanted in _EQUALITY.findall(expression):
            values = sorted({v for d in devices if (v := d.attribute_text(f"{domain}/{name}")) is not None})
            if values and wanted not in values:
                close = [v for v in values if wanted.lower() in v.lower()]
                listed = ", ".join(repr(v) for v in (close or values)[:6])
                among = f" among {alternative.class_name} devices" if own else " in the fleet"
                elsewhere = _classes_with(state, alternative.class_name, f"{domain}/{name}", wanted)
                hints.append(f"{domain}/{name} is never {wanted!r}{among}{elsewhere}; did you mean {listed}?")
    return (" " + " ".join(hints)) if hints else ""


def _accepted(state: FleetView, selectors: tuple[SelectorText, ...],
              devices: Iterable[FleetDevice] | None = None) -> list[FleetDevice]:
    """The devices (the fleet's by default) every one of `selectors` accepts; all of them when a selector
    fails on one (a hint is no place to refuse a class)."""
    devices = list(state.fleet.devices if devices is None else devices)
    try:
        return [d for d in devices if all(state.memo.matches(s, d) for s in selectors)]
    except SelectorError:
        return devices


def _classes_with(state: FleetView, own_class: str, attribute: str, wanted: str) -> str:
    """" (it is on N devices of class X)" when devices the claim's class excludes have the value, else ""."""
    having = [d for d in state.fleet.devices if d.attribute_text(attribute) == wanted]
    if not having:
        return ""
    named = [name for name, device_class in sorted(state.classes.items()) if name != own_class and _accepted(
        state, tuple(selector_text(s.cel.expression) for s in device_class.spec.selectors), having)]
    where = f"class {' or '.join(named)}" if named else "other classes"
    return f" (it is on {_plural(len(having), 'device')} of {where})"


def _closest(state: FleetView, alternative: Alternative) -> str:
    """For a memory ask no device meets (200 Gi), name the device with the most memory: the closest."""
    if not any("memory" in e for e in alternative.expressions):
        return ""
    sized = [d for d in state.fleet.devices if d.memory is not None]
    if not sized:
        return ""
    biggest = max(sized, key=lambda d: (d.memory.value if d.memory else 0, d.key))
    product = biggest.attribute_text(f"{biggest.driver}/productName") or biggest.name
    memory = biggest.memory.humanize() if biggest.memory else "?"
    return f" The closest device is {biggest.node}/{biggest.name} ({product}, {memory} of memory)."


def _constraint_text(state: FleetView, plan: Plan, alternative: Alternative) -> tuple[str, bool]:
    attribute = plan.group_attribute([alternative])
    if not isinstance(attribute, str):
        return "; enough free devices exist but the claim's constraints cannot be met together", False
    grouped = state.index(alternative, attribute)
    wanted = alternative.body.wanted
    if grouped.largest_group < wanted:
        lacking = (f"; {grouped.lacking} of them lack {attribute}" if grouped.lacking else "")
        return (f"; the claim's constraints cannot be met: no node has {wanted} such devices with one "
                f"{attribute} value (most: {grouped.largest_group}){lacking}", True)
    return (f"; the claim's constraints cannot be met now: at most {grouped.most_free()} free devices share "
            f"one {attribute} value on any node", False)


def _alternative_reason(state: FleetView, plan: Plan, alternative: Alternative, named: bool) -> tuple[str, bool]:
    index = state.index(alternative)
    wanted = "all" if alternative.all_mode else str(alternative.body.wanted)
    head = f"{_label(state, alternative)}: requested {wanted}" + (
        f" for request {alternative.result_name!r}" if named else "")
    fleet = state.fleet
    if not index.matching:
        nodes = len(fleet.nodes)
        return (f"{head}, but no device in the fleet ({len(fleet.devices)} devices on {_plural(nodes, 'node')}) "
                f"matches its selectors; it waits until one appears."
                f"{_hint(state, 'did-you-mean', alternative)}{_hint(state, 'closest', alternative)}", True)
    text = (f"{head}, free {index.free_total} of {index.matching} on {_plural(index.nodes_with_matches, 'node')}"
            f"{_held_back(index)}")
    if alternative.all_mode:
        if index.free_total < index.matching:
            text += "; All mode needs every matching device of a node, none of them in use"
        return text, False
    need = alternative.body.wanted
    if index.largest_group < need:
        return (f"{text}; no node has {need} such devices (most: {index.largest_group}), so it cannot be "
                "placed until the fleet changes", True)
    most = index.most_free()
    if index.free_total >= need > most:
        return f"{text}; at most {most} free on any one node", False
    if most >= need:
        extra, never = _constraint_text(state, plan, alternative)
        return text + extra, never
    return text, False


def pending_reason(state: FleetView, plan: Plan) -> tuple[str, bool]:
    """The reason text, and whether no device of today's fleet could ever satisfy the claim."""
    parts = []
    never_any = False
    named = len(plan.requests) > 1
    for _, alternatives in plan.requests:
        never_all = True
        for alternative in alternatives:
            state.meter.spend(STEP)  # the indexes it reads, built once each, are the pieces that are kept
            text, never = _alternative_reason(state, plan, alternative, named or len(alternatives) > 1)
            parts.append(text)
            never_all = never_all and never
        never_any = never_any or never_all
    if len(parts) > MAX_PARTS:  # a claim of many requests and alternatives: the first say it, explain has all
        parts = [*parts[:MAX_PARTS], f"and {len(parts) - MAX_PARTS} more requests and alternatives alike (see explain)"]
    return "; ".join(parts), never_any
