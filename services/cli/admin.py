"""Quota admins' commands over the admin API: `quota ...`, `explain` and `top`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from services.cli.bus import bus_error_text, nats_url_of
from services.cli.common import (
    MaybeOutput,
    Output,
    Unreachable,
    app,
    cli_settings,
    console,
    emit_document,
    make_table,
    options,
    print_done,
    print_listing,
    say_error,
)

quota_app = typer.Typer(help="Quotas over the admin API (--api, --token; see `claimbroker --help`).",
                        no_args_is_help=True)


app.add_typer(quota_app, name="quota")


API_TIMEOUT = 10.0  # seconds a command waits for the admin API, never longer
# Quota import and export run as jobs on the server, each answered within its CLAIMBROKER_ADMIN_JOB_TIMEOUT
# (60 s by default, a 503 past it): the command waits that long and a margin, so it hears the server's answer.
HEAVY_TIMEOUT = 90.0


def _admin_api() -> tuple[str, dict[str, str]]:
    """--api (or CLAIMBROKER_API), else the URL `up` wrote in the data folder, never a guess; --token,
    else the admin token `up` kept there."""
    data_dir = cli_settings().data_dir
    url = options().api
    if not url:
        url_file = data_dir / "api.url"
        if not url_file.exists():
            say_error(f"claimbroker: no admin API URL: pass --api URL (or CLAIMBROKER_API), or run where "
                      f"`claimbroker up` keeps its data ({url_file} does not exist)")
            raise typer.Exit(2)
        url = url_file.read_text().strip()
    token = options().token
    if not token:
        kept = data_dir / "admin.token"
        token = kept.read_text().strip() if kept.exists() else None
    return url.rstrip("/"), ({"Authorization": f"Bearer {token}"} if token else {})


def api_request(method: str, path: str, *, allow: tuple[int, ...] = (), timeout: float = API_TIMEOUT,
             **kwargs: Any) -> Any:
    """One call; a problem response (unless its status is in `allow`) is one line, `status title:
    detail`: a refusal (4xx) exits 1, a server that could not answer (5xx: busy, out of time) exits 3 and
    says when to retry where the server did."""
    import httpx

    url, headers = _admin_api()
    headers.update(kwargs.pop("headers", {}))
    try:
        ca = cli_settings().tls_ca
        response = httpx.request(method, url + path, headers=headers, timeout=timeout,
                                 verify=str(ca) if ca is not None else True, **kwargs)
    except httpx.TimeoutException:
        raise Unreachable(f"cannot reach the admin API at {url}: no answer within {timeout:g}s") from None
    except httpx.HTTPError as error:
        raise Unreachable(f"cannot reach the admin API at {url}: {bus_error_text(error)}") from None
    if response.status_code >= 400 and response.status_code not in allow:
        try:
            body = response.json()
            title, detail = body.get("title"), body.get("detail")
            message = detail if title == detail or not title else f"{title}: {detail}"
        except ValueError:
            message = response.text
        line = f"{method} {path}: {response.status_code} {message}"
        if response.status_code < 500:
            say_error(line)
            raise typer.Exit(1)
        retry = response.headers.get("Retry-After")
        raise Unreachable(line + (f" (retry after {retry}s)" if retry else ""))
    return response


@quota_app.command("list")
def quota_list(output: Output = "table") -> None:
    """Every tenant's quotas, per flavor."""
    tenants = {t["name"]: t for t in api_request("GET", "/v1/tenants").json()}
    quotas = api_request("GET", "/v1/quotas").json()
    rows = [[q["tenant"], tenants.get(q["tenant"], {}).get("cohort"), tenants.get(q["tenant"], {}).get("weight"),
             q["flavor"], q["nominal"], q["borrowingLimit"], q["lendingLimit"]] for q in quotas]
    print_listing(quotas, output, ["TENANT", "COHORT", "WEIGHT", "FLAVOR", "NOMINAL", "BORROWING", "LENDING"], rows)


@quota_app.command("set")
def quota_set(
    tenant: Annotated[str, typer.Argument()],
    flavor: Annotated[str, typer.Argument(help="a flavor name, e.g. H100 or H100-3g.40gb")],
    nominal: Annotated[int, typer.Option(min=0, help="devices of the flavor the tenant is guaranteed")],
    borrowing_limit: Annotated[int | None, typer.Option(min=0, help="at most this many beyond nominal")] = None,
    lending_limit: Annotated[int | None, typer.Option(min=0, help="lend at most this much unused nominal")] = None,
    output: Output = "table",
) -> None:
    """Set a tenant's quota for one flavor; a tenant named for the first time is created."""
    if api_request("GET", f"/v1/tenants/{tenant}", allow=(404,)).status_code == 404:
        api_request("PUT", f"/v1/tenants/{tenant}", json={})
    quota = api_request("PUT", f"/v1/tenants/{tenant}/quotas/{flavor}", json={
        "nominal": nominal, "borrowingLimit": borrowing_limit, "lendingLimit": lending_limit}).json()
    print_listing(quota, output, ["TENANT", "FLAVOR", "NOMINAL", "BORROWING", "LENDING"],
          [[quota["tenant"], quota["flavor"], quota["nominal"], quota["borrowingLimit"], quota["lendingLimit"]]])


@quota_app.command("delete")
def quota_delete(tenant: Annotated[str, typer.Argument()], flavor: Annotated[str, typer.Argument()],
                 output: MaybeOutput = None) -> None:
    """Remove a tenant's quota for one flavor."""
    api_request("DELETE", f"/v1/tenants/{tenant}/quotas/{flavor}")
    print_done(f"deleted quota {tenant}/{flavor}", {"tenant": tenant, "flavor": flavor, "deleted": True}, output)


@quota_app.command("import")
def quota_import(
    file: Annotated[Path, typer.Argument(help="a Quotas YAML (or JSON) document", exists=True, dir_okay=False,
                                         readable=True)],
    dry_run: Annotated[bool, typer.Option(help="show what would change, write nothing")] = False,
    output: Output = "table",
) -> None:
    """Make the ledger hold exactly FILE's quotas; what it does not name is deleted (see --dry-run)."""
    try:
        content = file.read_bytes()
    except OSError as error:
        say_error(f"{file}: {error}")
        raise typer.Exit(2) from None
    result = api_request("POST", "/v1/quotas/import", content=content, params={"dryRun": str(dry_run).lower()},
                      headers={"Content-Type": "application/yaml"}, timeout=HEAVY_TIMEOUT).json()
    if emit_document(result, output):
        return
    verb = "would change" if dry_run else "changed"

    def brief(row: dict[str, Any] | None) -> str:
        keys = ("nominal", "borrowingLimit", "lendingLimit", "cohort", "parent", "weight", "selector", "value",
                "halfLife")
        return ", ".join(f"{k}={row[k]}" for k in keys if row is not None and row.get(k) is not None) or "-"

    console.print(make_table(["ACTION", "ENTITY", "BEFORE", "AFTER"],
                         [[c["action"], c["entity"], brief(c["before"]) if c["before"] else "",
                           brief(c["after"]) if c["after"] else ""] for c in result["changes"]]))
    console.print(f"{len(result['changes'])} row(s) {verb}")
    for over in result["exceeding"]:
        holders = ", ".join(f"{c['namespace']}/{c['name']} ({c['devices']})" for c in over["claims"])
        say_error(f"{over['tenant']} holds {over['used']} {over['flavor']}, over its new quota "
                  f"{over['nominal']} + {over['borrowingLimit']} borrowing: {holders}")


@quota_app.command("export")
def quota_export(output: Annotated[str, typer.Option("--output", "-o", help="yaml | json")] = "yaml") -> None:
    """Print the Quotas document (what `quota import` reads)."""
    response = api_request("GET", "/v1/quotas/export", params={"format": "json" if output == "json" else "yaml"},
                        timeout=HEAVY_TIMEOUT)
    sys.stdout.write(response.text if output != "json" else json.dumps(response.json(), indent=2) + "\n")


@quota_app.command("usage")
def quota_usage(output: Output = "table") -> None:
    """Used, borrowed and lent devices per tenant and flavor, the pending demand, each tenant's fair share (with
    past use and when it halves, under fairSharing.halfLife) and the cohort tree with used / nominal per level."""
    usage = api_request("GET", "/v1/usage").json()
    rows = [[r["tenant"], r["cohort"], r["flavor"] or "(none)", r["nominal"], r["used"], r["usedUnits"],
             r["borrowed"], r["lent"]] for r in usage["items"]]
    print_listing(usage, output, ["TENANT", "COHORT", "FLAVOR", "NOMINAL", "USED", "UNITS", "BORROWED", "LENT"], rows)
    if output == "table" and usage["pending"]:
        console.print(make_table(["TENANT", "PENDING CLAIMS", "DEVICES REQUESTED"],
                             [[p["tenant"], p["claims"], p["devices"]] for p in usage["pending"]]))
    if output == "table" and not usage["enforced"]:
        console.print("no quota is set: the fleet is open to every tenant")
    if output == "table" and usage.get("shares"):
        console.print(make_table(*share_table(usage)))
    if output == "table" and usage.get("cohorts"):
        console.print(make_table(*cohort_tree_table(usage["cohorts"])))


def share_table(usage: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Fair share per tenant, lowest (next in line) first; with a half-life, its past use and when it halves."""
    from shared.admission.estimate_text import rough_duration

    if not usage.get("halfLife"):
        return (["TENANT", "WEIGHT", "IN USE", "SHARE"],
                [[s["tenant"], s["weight"], s["inUse"], s["share"]] for s in usage["shares"]])
    return (["TENANT", "WEIGHT", "IN USE", "PAST USE", "SHARE", "HALVES IN"],
            [[s["tenant"], s["weight"], s["inUse"], s["pastUse"], s["share"],
              rough_duration(s["halvesIn"]) if s["halvesIn"] is not None else "-"] for s in usage["shares"]])


def cohort_tree_table(cohorts: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The cohort tree, a child indented under its parent: per flavor, devices its subtree holds of the
    subtree's nominal quota, and the cohort's own quota and limits."""
    rows = []
    for cohort in cohorts:
        name = "  " * int(cohort["depth"]) + cohort["name"]
        for i, flavor in enumerate(cohort["flavors"] or [{}]):
            limits = (f"{flavor['ownNominal']}/{_limit(flavor['borrowingLimit'])}/{_limit(flavor['lendingLimit'])}"
                      if flavor else "")
            rows.append([name if i == 0 else "", flavor.get("flavor", ""),
                         f"{flavor['used']} / {flavor['nominal']}" if flavor else "", limits])
    return ["COHORT", "FLAVOR", "USED / NOMINAL", "OWN NOMINAL/BORROW/LEND"], rows


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


@app.command()
def explain(
    claim: Annotated[str, typer.Argument(help="the claim's name")],
    tenant: Annotated[str, typer.Option(help="the claim's tenant (namespace)")] = "default",
    output: Output = "table",
) -> None:
    """Why a claim waits: its state, reason and the allocator's structured explanation (blocking quotas,
    capacity per request, what preemption could do, what would let it in)."""
    result = api_request("GET", f"/v1/claims/{tenant}/{claim}/explain").json()
    if emit_document(result, output):
        return
    for line in explanation_lines(result):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if result["explain"] is not None:
        for columns, rows in explanation_tables(result["explain"]):
            if rows:
                console.print(make_table(columns, rows))


@app.command()
def estimates(
    window: Annotated[str, typer.Option(help="the claims allocated within this much time (7d, 24h, 90m)")] = "7d",
    output: Output = "table",
) -> None:
    """How good the start estimates were: over the claims allocated within WINDOW, per tenant and flavor, the
    median and p90 of |actual start - estimated p50|, for the first and the last estimate published."""
    from shared.settings import parse_duration

    try:
        seconds = parse_duration(window)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--window") from None
    result = api_request("GET", "/v1/estimates", params={"window": seconds}).json()
    if emit_document(result, output):
        return
    rows = estimate_rows(result)
    if not rows:
        console.print(f"no claim allocated within {window} had an estimate published")
        return
    console.print(make_table(["TENANT", "FLAVOR", "CLAIMS", "FIRST P50", "FIRST P90", "LAST P50", "LAST P90"], rows))


def estimate_rows(result: dict[str, Any]) -> list[list[Any]]:
    """`estimates`' table: a row per tenant and flavor, then the whole ('*'); errors as durations."""
    def took(seconds: float | None) -> str:
        if seconds is None:
            return "-"
        return f"{seconds / 3600:.1f}h" if seconds >= 3600 else f"{seconds / 60:.1f}m" if seconds >= 60 else (
            f"{seconds:.0f}s")

    groups = [*result.get("groups", []), *([{**result["overall"], "tenant": "*", "flavor": "*"}]
                                           if result.get("overall") else [])]
    return [[g["tenant"], g["flavor"] or "-", g["claims"], took(g["firstP50"]), took(g["firstP90"]),
             took(g["lastP50"]), took(g["lastP90"])] for g in groups]


def explanation_lines(result: dict[str, Any]) -> list[str]:
    """The head of `explain`'s table output: the claim, its state and reason, and the figures that are
    one line each (tenant, priority, flavors, estimated start, preemption, what would admit it)."""
    lines = [f"{result['namespace']}/{result['name']}: {result['state']}"]
    if result.get("reason"):
        lines.append(f"reason: {result['reason']}")
    found = result.get("explain")
    if found is None:
        return [*lines, *no_estimate_lines(result), "no structured explanation recorded"]
    tenant = found.get("tenant") or {}
    if tenant:
        figures = ", ".join(f"{label} {tenant[key]}" for key, label in (
            ("unitsInUse", "units in use"), ("weight", "weight"), ("share", "share")) if key in tenant)
        lines.append(f"tenant: {tenant.get('name')}" + (f" ({figures})" if figures else ""))
    if "priority" in found:
        lines.append(f"priority: {found['priority']}")
    if found.get("flavors"):
        lines.append(f"flavors it accepts: {', '.join(found['flavors'])}")
    if isinstance(gang := found.get("gang"), dict):
        lines.append(gang_line(gang))
    if found.get("unsatisfiable"):
        lines.append("no device of today's fleet could ever satisfy it as written")
    estimate = result.get("estimatedStart") or found.get("estimatedStart")
    if isinstance(estimate, dict) and estimate.get("p50"):
        blocked = ", ".join(estimate.get("blockedBy") or [])
        lines.append(f"estimated start: {estimate['p50']} (p90 {estimate.get('p90') or '?'})"
                     + (f", waiting for {blocked}" if blocked else ""))
    else:
        lines += no_estimate_lines(result)
    preemption = found.get("preemption") or {}
    if preemption:
        lines.append(f"preemption: {preemption.get('candidates', 0)} preemptible claim(s) running; "
                     f"{preemption.get('outcome', '')}".rstrip("; "))
    if found.get("budgetExceeded"):
        lines.append("its placement search ran past a cycle's budget: it goes on in slices")
    suggestions = found.get("toAdmit") or []
    lines += ["to admit it:", *(f"  - {s}" for s in suggestions)] if suggestions else []
    return lines


def no_estimate_lines(result: dict[str, Any]) -> list[str]:
    """A null start estimate's line, with why nothing can be said (its estimatedStartReason); none when no
    null one was published."""
    why = result.get("estimatedStartReason")
    return [f"estimated start: none: {why}"] if result.get("estimatedStart") is None and why else []


def gang_line(gang: dict[str, Any]) -> str:
    """A gang member's gang in one line: members received, those Rejected, and room per topology value."""
    line = (f"gang: {gang.get('name')}, {gang.get('received')} of {gang.get('size')} members received "
            f"({', '.join(gang.get('members') or [])})")
    if gang.get("rejected"):
        line += f"; Rejected: {', '.join(gang['rejected'])}"
    topology = gang.get("topology")
    if isinstance(topology, dict):
        free = ", ".join(f"{v.get('free')} on {v.get('value')}" for v in topology.get("mostFree") or [])
        line += (f"; on one {topology.get('key')} ({topology.get('mode')}): "
                 + (f"most free {free}" if free else "no node has the label"))
    return line


def explanation_tables(found: dict[str, Any]) -> list[tuple[list[str], list[list[Any]]]]:
    """The blocking quotas and the capacity per request, as tables (columns, rows)."""
    quotas = [[q.get("flavor"), q.get("requested"), q.get("used"), q.get("nominal"),
               "-" if q.get("borrowingLimit") is None else q["borrowingLimit"],
               ", ".join(f"{t} ({n})" for t, n in sorted((q.get("borrowedBy") or {}).items())) or "-", q.get("why")]
              for q in found.get("quota") or []]
    capacity = [[c.get("request"), c.get("requested"), c.get("matching"), c.get("free"), c.get("mostFreeOnOneNode"),
                 c.get("nodes"), ", ".join(f"{n} {why}" for why, n in sorted((c.get("unavailable") or {}).items()))
                 or "-"] for c in found.get("capacity") or []]
    return [(["BLOCKING QUOTA", "REQUESTED", "USED", "NOMINAL", "BORROWING LIMIT", "BORROWED BY", "WHY"], quotas),
            (["REQUEST", "REQUESTED", "MATCHING", "FREE", "MOST FREE ON A NODE", "NODES", "UNAVAILABLE"], capacity)]


def _frame_json(frame: Any) -> dict[str, Any]:
    """`top`'s frame as a document (-o json|yaml): the numbers the table shows."""
    from datetime import UTC, datetime

    return {
        "at": datetime.fromtimestamp(frame.at, UTC).isoformat().replace("+00:00", "Z") if frame.at else None,
        "quotaEnforced": frame.enforced,
        "flavors": [{"name": f.name, "total": f.total, "used": f.used, "free": f.free, "pending": f.pending}
                    for f in frame.flavors],
        "tenants": [{"tenant": t.tenant, "flavor": t.flavor, "used": t.used, "nominal": t.nominal,
                     "borrowed": t.borrowed, "pending": t.pending} for t in frame.tenants],
        "pending": {"claims": frame.pending_claims, "devices": frame.pending_devices},
        "staleNodes": list(frame.stale),  # not counted: nothing is placed on them
        "queue": [{"tenant": w.tenant, "name": w.name, "flavors": list(w.flavors), "reason": w.reason}
                  for w in frame.queue],
    }


def _show_frame(frame: Any, output: str) -> None:
    emit_document(_frame_json(frame), output)


@app.command()
def top(
    once: Annotated[bool, typer.Option(help="print one frame and exit")] = False,
    interval: Annotated[float, typer.Option(min=0.5, help="redraw at least this often, in seconds")] = 5.0,
    output: Output = "table",
) -> None:
    """A live view of the fleet per flavor and tenant (used, free, pending, borrowed) and the Pending queue,
    redrawn as statuses and inventory arrive; the admin API (--api, --token) and NATS (--nats). -o json|yaml
    prints one frame as a document (with --once)."""

    from services.cli import top as view

    if output != "table" and not once:
        raise typer.BadParameter("json and yaml print one frame: add --once", param_hint="'--output' / '-o'")
    url, headers = _admin_api()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a live view ends
        try:
            settings = cli_settings()
            asyncio.run(view.run(url, headers, nats_url_of(settings), console=console, once=once,
                                 interval=interval, tls_ca=settings.tls_ca, ttl=settings.inventory_ttl,
                                 emit=None if output == "table" else lambda frame: _show_frame(frame, output)))
        except view.Unavailable as error:
            raise Unreachable(str(error)) from None
