"""`claimbroker whatif`: the live ledger and fleet with proposed changes, decided by the same core as the
allocator (shared/admission/whatif.py), nothing written."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from services.cli.bus import last_per_subject, nats_url_of
from services.cli.claims import read_quotas_file
from services.cli.common import Output, app, cli_settings, console, emit_document, make_table, say_error, with_ledger
from shared.contract import subjects
from shared.fleet.freshness import stale_nodes


async def _read_fleet(url: str) -> Any:
    """Every node's last inventory on the bus, as the allocator holds it."""
    from shared.contract.events import read_inventory
    from shared.dra.inventory import Fleet

    nodes = {}
    for data in (await last_per_subject(url, subjects.INVENTORY_STREAM, subjects.INVENTORY_ALL)).values():
        inventory = read_inventory(json.loads(data))
        if not inventory.removed:
            nodes[inventory.node] = inventory
    return Fleet(nodes)


async def _read_ledger(factory: Any) -> tuple[Any, Any, Any, Any]:
    """Who runs, who waits, their documents, and the quotas, as a decision cycle reads them."""
    from shared.ledger.claims_read import read_claims
    from shared.ledger.quota_store import load_quota_config

    async with factory() as session:
        running, waiting, documents = await read_claims(session)
        return running, waiting, documents, await load_quota_config(session)


async def _read_past_use(factory: Any, half_life: float) -> Any:
    """The tenants' past use now, as the allocator keeps it in the ledger (counted under `half_life`)."""
    from shared.ledger.past_use import past_use_now

    async with factory() as session:
        return await past_use_now(session, time.time(), half_life)


def _added_nodes(paths: list[Path]) -> tuple[Any, ...]:
    from shared.contract.events import node_inventories
    from shared.fleet.sources import load_inventory

    if not paths:
        return ()
    documents = load_inventory(paths)
    return node_inventories(documents.slices, documents.labels, observed_at=time.time())


@app.command()
def whatif(
    quotas: Annotated[Path | None, typer.Option(help="a proposed Quotas file (the whole configuration)",
                                                exists=True, dir_okay=False, readable=True)] = None,
    add_inventory: Annotated[list[Path] | None, typer.Option("--add-inventory", help="nodes to add (repeatable)",
                                                             exists=True, dir_okay=False, readable=True)] = None,
    drain: Annotated[list[str] | None, typer.Option("--drain", help="a node to take away (repeatable)")] = None,
    remove_tenant: Annotated[list[str] | None, typer.Option("--remove-tenant", help="repeatable")] = None,
    half_life: Annotated[str | None, typer.Option(
        "--half-life", help="a changed fairSharing.halfLife (e.g. 24h; 0s: past use off)")] = None,
    mig_plan: Annotated[bool, typer.Option("--mig-plan", help="with the MIG re-layout `advise mig` plans")]
    = False,
    output: Output = "table",
    db: Annotated[str | None, typer.Option(help="ledger URL (default: the data folder's)")] = None,
) -> None:
    """What the live fleet and queue would become with proposed changes; nothing is written. Tree edits
    (cohorts' parents and quotas) come in --quotas; --half-life changes only fairSharing.halfLife."""
    from dataclasses import replace

    from shared.admission.whatif import Change, what_if
    from shared.dra.classes import merge_classes
    from shared.fleet.sources import InventoryFileError, load_inventory
    from shared.settings import parse_duration

    settings = cli_settings(db=db)
    try:  # the files first, before the bus and the ledger are read: their errors name the file and the field
        proposed = read_quotas_file(quotas) if quotas is not None else None
        added = _added_nodes(list(add_inventory or []))
        classes = merge_classes(load_inventory(list(add_inventory or [])).classes if add_inventory else [])
    except (InventoryFileError, ValueError) as error:
        say_error(str(error))
        raise typer.Exit(1) from None
    try:
        changed_half_life = parse_duration(half_life) if half_life is not None else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--half-life") from None
    fleet = asyncio.run(_read_fleet(nats_url_of(settings)))
    running, waiting, documents, config = asyncio.run(with_ledger(db, _read_ledger))
    if changed_half_life is not None:
        proposed = replace(proposed if proposed is not None else config, half_life=changed_half_life)
    counted = config.half_life or (proposed.half_life if proposed is not None else 0.0)
    past = asyncio.run(with_ledger(db, lambda factory: _read_past_use(factory, counted))) if counted > 0 else {}
    unknown = sorted(set(drain or ()) - set(fleet.nodes))
    if unknown:
        say_error(f"claimbroker: no node {', '.join(unknown)} in the fleet: nothing to drain")
        raise typer.Exit(1)
    if mig_plan:  # the re-laid nodes as the plan carves them, after any added ones
        from shared.admission.mig_plan import plan_mig

        planned = plan_mig(fleet, merge_classes([]), config, running, waiting)
        added = (*added, *planned.nodes.values())
    change = Change(quotas=proposed, add_nodes=added, drain=frozenset(drain or ()),
                    remove_tenants=frozenset(remove_tenant or ()))
    stale = stale_nodes({name: node.observed_at for name, node in fleet.nodes.items()}, time.time(),
                        settings.inventory_ttl)  # each node's last message on the bus, heartbeats included
    answer = what_if(fleet, classes, config, running, waiting, documents, change, stale, past).to_json()
    if emit_document(answer, output):
        return
    console.print(f"admitted: {len(answer['admitted'])}, preempted: {len(answer['preempted'])}, "
                  f"beyond a quota: {len(answer['overQuota']['claims'])}")
    rows = [[claim, "admitted", ""] for claim in answer["admitted"]]
    rows += [[p["claim"], "preempted", p["rule"]] for p in answer["preempted"]]
    rows += [[c["claim"], "beyond its quota", c["flavor"]] for c in answer["overQuota"]["claims"]]
    if rows:
        console.print(make_table(["CLAIM", "WOULD BE", "RULE / FLAVOR"], rows))
    usage = [[tenant, flavor, n["before"], n["after"]] for tenant, per in answer["usage"].items()
             for flavor, n in per.items() if n["before"] != n["after"]]
    if usage:
        console.print(make_table(["TENANT", "FLAVOR", "HELD NOW", "HELD AFTER"], usage))
    tenants = [[t, s["before"], s["after"], answer["pending"][t]["before"], answer["pending"][t]["after"]]
               for t, s in answer["shares"].items()]
    console.print(make_table(["TENANT", "SHARE NOW", "SHARE AFTER", "WAITING NOW", "WAITING AFTER"], tenants))


advise_app = typer.Typer(help="Advice from the live fleet and queue; nothing is changed.", no_args_is_help=True)
app.add_typer(advise_app, name="advise")


@advise_app.command("mig")
def advise_mig(
    output: Annotated[str, typer.Option("--output", "-o", help="table | json | yaml (yaml: the mig-parted config)")]
    = "table",
    db: Annotated[str | None, typer.Option(help="ledger URL (default: the data folder's)")] = None,
) -> None:
    """A MIG re-layout of idle GPUs (a mig-parted config per node) that admits the most waiting claims,
    never moving a running one."""
    import yaml

    from shared.admission.mig_plan import plan_mig
    from shared.dra.classes import merge_classes

    if output not in ("table", "json", "yaml"):
        raise typer.BadParameter(f"must be table, json or yaml, not {output!r}", param_hint="--output")
    settings = cli_settings(db=db)
    fleet = asyncio.run(_read_fleet(nats_url_of(settings)))
    running, waiting, _, config = asyncio.run(with_ledger(db, _read_ledger))
    plan = plan_mig(fleet, merge_classes([]), config, running, waiting)
    if output == "yaml":  # what mig-parted reads
        print(yaml.safe_dump(plan.mig_parted(), sort_keys=False), end="")
        return
    if emit_document(plan.to_json(), output):
        return
    if not plan.layouts:
        console.print(f"no re-layout would admit more: {len(plan.without)} waiting claim(s) fit as the GPUs are")
        return
    console.print(make_table(["NODE", "GPU", "MODEL", "NOW", "PLANNED"],
                         [[g.node, g.gpu, g.model, g.now, g.planned] for g in plan.layouts]))
    gained = plan.gained
    console.print(f"it would admit {len(gained)} more waiting claim(s): "
                  + ", ".join("/".join(k) for k in gained[:20]) + (" ..." if len(gained) > 20 else ""))
    console.print("mig-parted config: claimbroker advise mig -o yaml")
