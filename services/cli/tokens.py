"""API tokens in the ledger: `token create|list|revoke` (they work before the API runs).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from services.cli.common import MaybeOutput, Output, app, print_done, print_listing, say_error, with_ledger

token_app = typer.Typer(help="API tokens.", no_args_is_help=True)


app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="admin | viewer")],
    tenant: Annotated[str | None, typer.Option(help="limit a viewer to one tenant")] = None,
    ttl: Annotated[str | None, typer.Option(help="stop working after this long (30d, 12h, 90m); default never")]
    = None,
    db: Annotated[str | None, typer.Option()] = None,
    output: MaybeOutput = None,
) -> None:
    """Create an API token in the ledger and print it once (the ledger must exist: `up` or `migrate`)."""
    from shared.ledger.tokens import create_token
    from shared.settings import parse_duration

    if role not in ("admin", "viewer"):
        say_error("claimbroker token create: --role must be admin or viewer")
        raise typer.Exit(2)
    from shared.ledger.tokens import MAX_TTL_S

    try:
        seconds = parse_duration(ttl) if ttl is not None else None
        if seconds is not None and not 0 < seconds <= MAX_TTL_S:
            raise ValueError("a token's ttl must be positive and at most ten years")
    except ValueError as error:
        say_error(f"claimbroker token create: --ttl: {error}")
        raise typer.Exit(2) from None
    token = asyncio.run(with_ledger(db, lambda factory: create_token(factory, role, tenant, seconds)))
    print_done(token, {"token": token, "role": role, "tenant": tenant, "ttlSeconds": seconds}, output)


@token_app.command("list")
def token_list(output: Output = "table", db: Annotated[str | None, typer.Option()] = None) -> None:
    """Every API token in the ledger (id, role, tenant, created, expires, revoked); never the token itself."""
    from shared.ledger.tokens import list_tokens, token_json

    async def read(factory: Any) -> list[dict[str, Any]]:
        async with factory() as session:
            return [token_json(row) for row in await list_tokens(session)]

    tokens = asyncio.run(with_ledger(db, read))
    print_listing(tokens, output, ["ID", "ROLE", "TENANT", "CREATED", "EXPIRES", "REVOKED"],
          [[t["id"], t["role"], t["tenant"] or "-", t["createdAt"], t["expiresAt"] or "never", t["revokedAt"] or "-"]
           for t in tokens])


@token_app.command("revoke")
def token_revoke(token_id: Annotated[int, typer.Argument(help="the id `token list` shows")],
                 db: Annotated[str | None, typer.Option()] = None, output: MaybeOutput = None) -> None:
    """Revoke an API token: refused at its next request."""
    from shared.ledger.tokens import revoke_token

    async def revoke(factory: Any) -> bool:
        async with factory() as session, session.begin():
            return await revoke_token(session, token_id, "cli") is not None

    if not asyncio.run(with_ledger(db, revoke)):
        say_error(f"claimbroker: no token {token_id}")
        raise typer.Exit(1)
    print_done(f"token {token_id} revoked", {"id": token_id, "revoked": True}, output)
