"""API tokens over the API: admins list, create (shown once, optionally expiring) and revoke them. A
revoked or expired token is refused at its next request: every request looks its token up."""

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path
from pydantic import Field

from services.admin_api.access import Caller, Session, admin
from services.admin_api.fields import DnsLabel, Input, Model, Stamp
from services.admin_api.problems import PROBLEMS
from shared.ledger.tokens import MAX_TTL_S, add_token, list_tokens, revoke_token

router = APIRouter(responses=PROBLEMS)


class TokenIn(Input):
    role: Literal["admin", "viewer"]
    tenant: DnsLabel | None = Field(default=None, description="limits a viewer to one tenant")
    ttl: float | None = Field(default=None, gt=0, le=MAX_TTL_S, allow_inf_nan=False,
                              description="seconds until it stops working (at most ten years); none: until revoked")


class TokenOut(Model):
    id: int
    role: str
    tenant: str | None
    created_at: Stamp
    expires_at: Stamp | None
    revoked_at: Stamp | None


class NewToken(TokenOut):
    token: str = Field(description="the bearer token itself, shown this once: only its hash is kept")


@router.get("/v1/tokens", response_model=list[TokenOut], tags=["tokens"])
async def get_tokens(s: Session, token: Caller) -> list[TokenOut]:
    """Every token, revoked and expired ones too; never what a token says."""
    admin(token)
    return [TokenOut.model_validate(row) for row in await list_tokens(s)]


@router.post("/v1/tokens", response_model=NewToken, status_code=201, tags=["tokens"])
async def post_token(body: TokenIn, s: Session, token: Caller) -> NewToken:
    admin(token)
    if body.tenant is not None and body.role != "viewer":
        raise HTTPException(422, "only a viewer token can be limited to a tenant")
    async with s.begin():
        plaintext, row = await add_token(s, body.role, body.tenant, body.ttl, actor=token.actor)
    return NewToken(token=plaintext, **TokenOut.model_validate(row).model_dump())


@router.delete("/v1/tokens/{token_id}", status_code=204, tags=["tokens"])
async def delete_token(token_id: Annotated[int, Path(ge=1, le=2**63 - 1)], s: Session, token: Caller) -> None:
    """Revoked at once; the row stays, so the audit log can name it."""
    admin(token)
    async with s.begin():
        if await revoke_token(s, token_id, token.actor) is None:
            raise HTTPException(404, f"token {token_id} not found")
