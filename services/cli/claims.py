"""A tenant's commands: `submit`, `status`, `release`, and `simulate` offline.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from services.cli.bus import (
    _claim_documents,
    _connect,
    _nats_url,
    _own_tenant_only,
    _publish,
    _publish_claims,
    _status_table,
    read_statuses,
    submit_and_wait,
    watch_statuses,
)
from services.cli.common import Output, _emit, _settings, app, console, err
from shared.contract import subjects


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="YAML with one or more ResourceClaims")],
    tenant: Annotated[str | None, typer.Option(help="tenant for claims without a namespace")] = None,
    priority: Annotated[int | None, typer.Option(help="set claimbroker.io/priority")] = None,
    wait: Annotated[float | None, typer.Option(help="wait this many seconds for each status")] = None,
) -> None:
    """Publish each ResourceClaim in FILE to the queue."""
    settings = _settings()
    url = _nats_url(settings)
    claims = _claim_documents(file, tenant)
    if wait is None:
        for tenant_name, name in asyncio.run(_publish_claims(url, claims, priority)):
            console.print(f"submitted {tenant_name}/{name}")
        return
    sent, results = asyncio.run(submit_and_wait(url, claims, priority, wait))
    for status in results:
        print(json.dumps(status))
    if len(results) < len(set(sent)):
        err.print(f"{len(set(sent)) - len(results)} claim(s) had no status within {wait}s")
        raise typer.Exit(1)
    rejected = [f"{s['namespace']}/{s['name']}" for s in results if s.get("state") == "Rejected"]
    if rejected:  # a refusal, as the contract's exit statuses say: the claim is wrong as written
        err.print(f"rejected: {', '.join(rejected)} (the reason is in the status above)")
        raise typer.Exit(1)


@app.command()
def status(
    name: Annotated[str | None, typer.Argument()] = None,
    tenant: Annotated[str | None, typer.Option()] = None,
    output: Output = "table",
    watch: Annotated[bool, typer.Option(help="keep printing as statuses change")] = False,
) -> None:
    """Print claim states."""
    url = _nats_url(_settings())

    def show(statuses: list[dict[str, Any]]) -> None:
        if not _emit(statuses, output):
            console.print(_status_table(statuses))

    if not watch:
        show(asyncio.run(read_statuses(url, tenant or "*", name or "*")))
        return

    async def follow() -> None:
        async for statuses in watch_statuses(url, tenant or "*", name or "*"):
            show(statuses)

    asyncio.run(follow())


@app.command()
def release(
    name: Annotated[str, typer.Argument()],
    tenant: Annotated[str | None, typer.Option(help="the claim's tenant (default: a tenant credential's own)")]
    = None,
) -> None:
    """Release an allocated or pending claim."""
    import secrets

    from shared.contract import bus_auth

    url = _nats_url(_settings())
    tenant = tenant or bus_auth.tenant_of_user(bus_auth.user_of(url) or "") or "default"
    _own_tenant_only(url, tenant)
    known = asyncio.run(read_statuses(url, tenant, name))
    if not known or known[-1]["state"] not in ("Pending", "Allocated"):
        what = f"its last status is {known[-1]['state']}" if known else "it has no status (yet)"
        err.print(f"claimbroker: {tenant}/{name} is neither waiting nor allocated: {what}; nothing to release")
        raise typer.Exit(1)

    async def main() -> None:
        nc = await _connect(url)
        try:
            await _publish(nc.jetstream(), url, subjects.release(tenant), {"name": name},
                           f"release:{tenant}:{name}:{time.time_ns()}:{secrets.token_hex(8)}")  # unguessable
        finally:
            await nc.close()

    asyncio.run(main())
    console.print(f"release requested for {tenant}/{name}")


@app.command()
def simulate(
    inventory: Annotated[list[Path], typer.Option("--inventory", help="inventory file")],
    claims: Annotated[list[Path], typer.Option("--claims", help="claims file; each file is one wave")],
    quotas: Annotated[Path | None, typer.Option(help="Quotas file")] = None,
    output: Output = "table",
    tenant: Annotated[str, typer.Option(help="tenant of claims without a namespace")] = "default",
) -> None:
    """Run the allocation decisions offline: the same core the allocator runs."""
    from shared.admission.quota import QuotaConfig
    from shared.admission.simulate import read_claim_document, run_waves
    from shared.dra.classes import merge_classes
    from shared.dra.inventory import Fleet
    from shared.fleet.sources import InventoryFileError, load_inventory, load_yaml_documents

    try:
        documents = load_inventory(inventory)
        waves = [[read_claim_document(d, tenant) for d in load_yaml_documents(path) if d is not None]
                 for path in claims]
        config = _read_quotas(quotas) if quotas is not None else QuotaConfig()
    except (InventoryFileError, ValueError) as error:
        err.print(str(error))
        raise typer.Exit(1) from None
    fleet = Fleet.from_slices(documents.slices, documents.labels)
    result = run_waves(fleet, merge_classes(documents.classes), waves, config).to_json()
    if not _emit(result, output):
        console.print(_status_table(result["claims"]))
        for event in result["events"]:
            console.print(f"{event['claim']} {event['state']} by {event['by']} ({event['rule']}): {event['reason']}")


def _read_quotas(path: Path) -> Any:
    """A Quotas file, with every flavor selector compiled: errors name the file and the field."""
    from shared.admission.quota import QuotaFileError, parse_quotas
    from shared.dra.cel import SelectorError, compile_selector
    from shared.fleet.sources import load_yaml_documents

    documents = [d for d in load_yaml_documents(path) if d is not None]
    if len(documents) != 1:
        raise QuotaFileError(f"{path}: expected one Quotas document, found {len(documents)}")
    config = parse_quotas(documents[0], where=str(path))
    for i, flavor in enumerate(config.listed_flavors):
        try:
            compile_selector(flavor.selector)
        except SelectorError as error:
            raise QuotaFileError(f"{path}: flavors[{i}].selector: {error}") from None
    return config
