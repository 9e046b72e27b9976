"""What `explain` says of a gang member: its gang's members, what the gang still lacks and, with a topology
key, what the values of that key have free, so that whoever waits sees the gang's numbers and not only its
own claim's.
"""

from __future__ import annotations

from typing import Any

from shared.admission.gang_topology import ordered_values
from shared.admission.gangs import WaitingGangs
from shared.admission.model import Waiting
from shared.dra.allocation import FleetState
from shared.dra.inventory import Fleet

MAX_NAMES = 16  # members and Rejected members named one by one (a gang may have 256)
MAX_VALUES = 8  # topology values listed, the most free first


def gang_section(gangs: WaitingGangs, placement: FleetState, fleet: Fleet, waiting: Waiting) -> dict[str, Any] | None:
    """The `gang` part of a waiting member's explanation; None for a claim of no gang."""
    key = gangs.members.get(waiting.key)
    members = gangs.gangs.get(key) if key is not None else None
    if key is None or not members or waiting.name not in members:
        return None
    settings = members[waiting.name][1]
    names = [m.name for m, _ in sorted(members.values(), key=lambda m: (m[0].arrival, m[0].name))]
    rejected = [n for n in gangs.lost.get(key, ()) if n not in members]
    section: dict[str, Any] = {"name": key[1], "size": settings.size, "received": len(names),
                               "members": names[:MAX_NAMES], "rejected": rejected[:MAX_NAMES], "topology": None}
    if settings.topology is not None:
        domains = gangs.domains.of(fleet, settings.topology)
        free = gangs.domains.free(placement, waiting, domains) if domains else {}
        section["topology"] = {
            "key": settings.topology, "mode": settings.mode, "waitSeconds": settings.wait, "values": len(domains),
            "mostFree": [{"value": v, "free": free[v], "nodes": len(domains[v])}
                         for v in ordered_values(free)[:MAX_VALUES]]}
    return section


def gang_suggestions(section: dict[str, Any]) -> list[str]:
    """What would let the gang in, first among its member's `toAdmit`."""
    out = []
    missing = section["size"] - section["received"]
    if missing > 0:
        again = f" ({', '.join(section['rejected'])} Rejected: fix and submit again)" if section["rejected"] else ""
        out.append(f"submit the gang's {missing} missing member(s): gang-size {section['size']}, "
                   f"{section['received']} received{again}")
    topology = section["topology"]
    if topology is not None and topology["values"] == 0:
        out.append(f"no node has the label {topology['key']}: label the nodes, or drop the gang's gang-topology")
    elif topology is not None and topology["mode"] == "required" and missing <= 0:
        out.append(f"wait for room on one {topology['key']} value, or set gang-topology-mode: preferred with a "
                   "gang-topology-wait so that it may be split")
    return out
