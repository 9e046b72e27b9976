"""Bus credentials over the admin API: `credentials create|list|revoke`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from services.cli.admin import api_request
from services.cli.common import (
    MaybeOutput,
    Output,
    app,
    cli_settings,
    console,
    emit_document,
    print_done,
    print_listing,
    say_error,
)
from shared.contract import subjects

credentials_app = typer.Typer(help="Bus credentials (over the admin API: --api, --token).", no_args_is_help=True)


app.add_typer(credentials_app, name="credentials")


@credentials_app.command("create")
def credentials_create(
    tenant: Annotated[str | None, typer.Option(
        help="submit and release this tenant's claims, read its statuses; with --alerts: read its alerts only")]
    = None,
    alerts: Annotated[bool, typer.Option("--alerts", help="read alerts only: every tenant's, or --tenant's")] = False,
    output: Output = "table",
) -> None:
    """Create a bus credential and print its password once."""
    from shared.contract import bus_auth

    if tenant is None and not alerts:
        say_error("claimbroker: give --tenant T, --alerts, or both (one tenant's alerts)")
        raise typer.Exit(2)
    body = {"role": "alerts", "tenant": tenant} if alerts else {"role": "tenant", "tenant": tenant}
    created = api_request("POST", "/v1/credentials", json=body).json()
    nats_file = cli_settings().data_dir / "nats.url"
    where = nats_file.read_text().strip() if nats_file.exists() else "nats://HOST:4222"
    created["url"] = bus_auth.url_with_user(where, created["user"], created["password"])
    if not emit_document(created, output):
        what = f"{tenant}'s alerts" if alerts and tenant else "every tenant's alerts" if alerts else tenant
        console.print(f"credential {created['id']} for {what} (the password is shown this once):")
        console.print(f"  user      {created['user']}")
        console.print(f"  password  {created['password']}")
        if alerts:
            reads = subjects.alerts_of(tenant) if tenant else subjects.ALERTS_ALL
            console.print(f"  reads     {reads}")
        console.print(f"  use it as --nats {created['url']}", soft_wrap=True)


@credentials_app.command("list")
def credentials_list(output: Output = "table") -> None:
    """Every bus credential (revoked ones too); never a password."""
    rows = api_request("GET", "/v1/credentials").json()
    print_listing(rows, output, ["ID", "USER", "ROLE", "TENANT", "CREATED", "REVOKED"],
          [[c["id"], c["user"], c["role"], c["tenant"] or "-", c["createdAt"], c["revokedAt"] or "-"] for c in rows])


@credentials_app.command("revoke")
def credentials_revoke(credential_id: Annotated[int, typer.Argument(help="the id `credentials list` shows")],
                       output: MaybeOutput = None) -> None:
    """Revoke a bus credential: its connections are closed and it is refused from then on."""
    api_request("DELETE", f"/v1/credentials/{credential_id}")
    print_done(f"credential {credential_id} revoked", {"id": credential_id, "revoked": True}, output)
