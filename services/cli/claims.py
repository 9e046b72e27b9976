"""A tenant's commands: `submit`, `status`, `release`, and `simulate` offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from services.cli.bus import (
    SendProgress,
    claim_documents,
    connect_bus,
    nats_url_of,
    own_tenant_only,
    publish_claims,
    publish_document,
    read_statuses,
    status_table,
    submit_and_wait,
    watch_statuses,
)
from services.cli.common import (
    Interrupted,
    MaybeOutput,
    Output,
    Unreachable,
    app,
    cli_settings,
    console,
    emit_document,
    make_table,
    say_error,
)
from shared.contract import subjects
from shared.contract.messages import ClaimStatus
from shared.dra.claims import INT32_MAX, INT32_MIN


def _duration(value: str) -> float:
    """A duration option (30s, 10m, 2h, or seconds), at least 0."""
    from shared.settings import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    if not math.isfinite(seconds):
        raise typer.BadParameter(f"{value!r} is too long a duration")
    return seconds


def _positive_seconds(value: float | None) -> float | None:
    if value is not None and not value > 0:  # NaN too
        raise typer.BadParameter(f"must be a positive number of seconds, not {value:g}")
    return value


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="YAML with one or more ResourceClaims", exists=True, dir_okay=False,
                                         readable=True)],
    tenant: Annotated[str | None, typer.Option(
        help="tenant for claims without a namespace (default: a tenant credential's own, else default)")] = None,
    priority: Annotated[int | None, typer.Option(help="set claimbroker.io/priority", min=INT32_MIN, max=INT32_MAX)]
    = None,
    wait: Annotated[float | None, typer.Option(help="wait this many seconds for each status",
                                               callback=_positive_seconds)] = None,
    output: MaybeOutput = None,
) -> None:
    """Publish each ResourceClaim in FILE to the queue. Without -o: a line per claim sent, or with --wait
    each claim's status as a JSON line; -o table|json|yaml: the claims sent, or their statuses."""
    from shared.contract import bus_auth

    settings = cli_settings()
    url = nats_url_of(settings)
    own = bus_auth.tenant_of_user(bus_auth.user_of(url) or "")  # a tenant credential's claims are its tenant's
    claims = claim_documents(file, tenant, own or "default")
    progress = SendProgress(len(claims))
    try:
        if wait is None:
            sent = asyncio.run(publish_claims(url, claims, priority, progress))
        else:
            sent, results = asyncio.run(submit_and_wait(url, claims, priority, wait, progress))
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {progress.summary()}") from None
    except Unreachable as error:
        raise Unreachable(f"{error}; {progress.summary()}") from None
    if wait is None:
        submitted = [{"namespace": t, "name": n} for t, n in sent]
        if output is None:
            for tenant_name, name in sent:
                console.print(f"submitted {tenant_name}/{name}", markup=False, highlight=False, soft_wrap=True)
        elif not emit_document(submitted, output):
            console.print(make_table(["TENANT", "CLAIM"], [[s["namespace"], s["name"]] for s in submitted]))
        return
    if output is None:
        for status in results:
            print(json.dumps(status))
    elif not emit_document(results, output):
        console.print(status_table(results, datetime.now(UTC)))
    if len(results) < len(set(sent)):
        say_error(f"claimbroker: {len(set(sent)) - len(results)} claim(s) had no status within {wait:g}s")
        raise typer.Exit(1)
    rejected = [f"{s['namespace']}/{s['name']}" for s in results if s.get("state") == "Rejected"]
    if rejected:  # a refusal, as the contract's exit statuses say: the claim is wrong as written
        say_error(f"claimbroker: rejected: {', '.join(rejected)} (the reason is in the status above)")
        raise typer.Exit(1)


@app.command()
def status(
    name: Annotated[str | None, typer.Argument()] = None,
    tenant: Annotated[str | None, typer.Option()] = None,
    output: Output = "table",
    watch: Annotated[bool, typer.Option(help="keep printing as statuses change")] = False,
) -> None:
    """Print claim states. With NAME: exit 1 when no such claim has a status, or when it is Rejected."""
    url = nats_url_of(cli_settings())

    def show(statuses: list[ClaimStatus]) -> None:
        if not emit_document(statuses, output):
            console.print(status_table(statuses, datetime.now(UTC)))

    if not watch:
        statuses = asyncio.run(read_statuses(url, tenant or "*", name or "*"))
        if name is not None and not statuses:  # an unknown claim is a refusal, as kubectl's NotFound
            whose = f"tenant {tenant}'s" if tenant else "any tenant's"
            say_error(f"claimbroker: no claim {name!r} has a status among {whose} claims (see `claimbroker status`)")
            raise typer.Exit(1)
        show(statuses)
        rejected = [s for s in statuses if s["state"] == "Rejected"]
        if name is not None and rejected:
            say_error(f"claimbroker: {rejected[0]['namespace']}/{name} is Rejected: it will never be allocated as "
                      "written (the reason is in its status)")
            raise typer.Exit(1)
        return

    async def follow() -> None:
        shown: list[ClaimStatus] | None = None
        async for statuses in watch_statuses(url, tenant or "*", name or "*"):
            if statuses != shown:  # a status sent again unchanged is no news
                show(statuses)
                shown = statuses

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends
        asyncio.run(follow())


@app.command()
def release(
    name: Annotated[str, typer.Argument()],
    tenant: Annotated[str | None, typer.Option(help="the claim's tenant (default: a tenant credential's own)")]
    = None,
    output: MaybeOutput = None,
) -> None:
    """Release an allocated or pending claim."""
    import secrets

    from shared.contract import bus_auth

    url = nats_url_of(cli_settings())
    tenant = tenant or bus_auth.tenant_of_user(bus_auth.user_of(url) or "") or "default"
    own_tenant_only(url, tenant)
    known = asyncio.run(read_statuses(url, tenant, name))
    if not known or known[-1]["state"] not in ("Pending", "Allocated"):
        what = f"its last status is {known[-1]['state']}" if known else "it has no status (yet)"
        say_error(f"claimbroker: {tenant}/{name} is neither waiting nor allocated: {what}; nothing to release")
        raise typer.Exit(1)

    async def main() -> None:
        nc = await connect_bus(url)
        try:
            await publish_document(nc.jetstream(), url, subjects.release(tenant), {"name": name},
                           f"release:{tenant}:{name}:{time.time_ns()}:{secrets.token_hex(8)}")  # unguessable
        finally:
            await nc.close()

    asyncio.run(main())
    requested = {"namespace": tenant, "name": name, "stateBefore": known[-1]["state"], "release": "requested"}
    if output is None:
        console.print(f"release requested for {tenant}/{name}", markup=False, highlight=False, soft_wrap=True)
    elif not emit_document(requested, output):
        console.print(make_table(["TENANT", "CLAIM", "STATE BEFORE", "RELEASE"], [list(requested.values())]))


@app.command()
def simulate(
    inventory: Annotated[list[Path], typer.Option("--inventory", help="inventory file", exists=True, dir_okay=False,
                                                  readable=True)],
    claims: Annotated[list[Path], typer.Option("--claims", help="claims file; each file is one wave", exists=True,
                                               dir_okay=False, readable=True)],
    quotas: Annotated[Path | None, typer.Option(help="Quotas file", exists=True, dir_okay=False, readable=True)]
    = None,
    output: Output = "table",
    tenant: Annotated[str, typer.Option(help="tenant of claims without a namespace")] = "default",
    min_runtime: Annotated[float, typer.Option(
        "--min-runtime", parser=_duration, metavar="DURATION",
        help="minRuntime of tenants without their own in the Quotas file (e.g. 2m; default 0s)")] = 0.0,
    gang_reserve_after: Annotated[float, typer.Option(
        "--gang-reserve-after", parser=_duration, metavar="DURATION",
        help="gangReserveAfter of tenants without their own in the Quotas file (e.g. 5m; default 0s: off)")] = 0.0,
) -> None:
    """Run the allocation decisions offline: the same core the allocator runs, on a clock of its own
    (Advance documents in a claims file let time pass; Release documents release a claim)."""
    from dataclasses import replace

    from shared.admission.quota import QuotaConfig
    from shared.admission.simulate import run_waves
    from shared.admission.wave_documents import read_wave
    from shared.dra.classes import merge_classes
    from shared.dra.inventory import Fleet
    from shared.fleet.sources import InventoryFileError, load_inventory, load_yaml_documents

    try:
        documents = load_inventory(inventory)
        waves = [read_wave(load_yaml_documents(path), tenant, str(path)) for path in claims]
        config = read_quotas_file(quotas) if quotas is not None else QuotaConfig()
        config = replace(config, default_min_runtime=min_runtime, default_gang_reserve_after=gang_reserve_after)
    except (InventoryFileError, ValueError) as error:
        say_error(str(error))
        raise typer.Exit(1) from None
    fleet = Fleet.from_slices(documents.slices, documents.labels)
    simulated = run_waves(fleet, merge_classes(documents.classes), waves, config)
    for line in simulated.ignored:
        say_error(line)
    result = simulated.to_json()
    if not emit_document(result, output):
        console.print(simulate_table(result["claims"]))
        for event in result["events"]:
            console.print(f"{event['claim']} {event['state']} by {event['by']} ({event['rule']}): {event['reason']}")


def eta_text(estimate: Any, why: Any = None) -> str:
    """A Pending claim's estimatedStart for a table: its p50, and its p90 in brackets; 'none: <gist>' for a
    null one with its reason (estimatedStartReason; -o json has it whole); '-': none."""
    from shared.admission.estimate_text import first_clause

    if not isinstance(estimate, dict) or not estimate.get("p50"):
        return f"none: {first_clause(why)}" if estimate is None and isinstance(why, str) and why else "-"
    return f"{estimate['p50']} ({estimate.get('p90') or '?'})"


def simulate_table(claims: list[dict[str, Any]]) -> Any:
    """simulate's claims as a table: the status columns, and ETA for the Pending ones (on the simulated clock)."""
    rows = []
    for c in claims:
        allocation = c.get("allocation") or {}
        devices = ", ".join(r["device"] for r in (allocation.get("devices") or {}).get("results", []))
        eta = eta_text(c.get("estimatedStart"), c.get("estimatedStartReason")) if c["state"] == "Pending" else ""
        rows.append([c["namespace"], c["name"], c["state"], allocation.get("nodeName", ""), devices, eta,
                     c.get("reason") or ""])
    return make_table(["TENANT", "CLAIM", "STATE", "NODE", "DEVICES", "ETA", "REASON"], rows)


def read_quotas_file(path: Path) -> Any:
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
        except SelectorError as error:  # with a caret under the error: this is the file's author's terminal
            raise QuotaFileError(f"{path}: flavors[{i}].selector: {error.pointed}") from None
    return config
