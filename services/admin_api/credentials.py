"""Bus credentials over the API: quota admins create (the password shown once), list and revoke them,
each audited. Where the API runs beside the embedded NATS server (`up`), a change is applied to the
server before the answer; elsewhere the process that renders the server's users follows the ledger."""

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import Field, model_validator

from services.admin_api.access import Caller, Session, admin
from services.admin_api.fields import DnsLabel, Input, Model, Stamp
from services.admin_api.problems import PROBLEMS
from shared.contract import bus_auth
from shared.ledger.bus_credentials import add_credential, list_credentials, revoke_credential

router = APIRouter(responses=PROBLEMS)


class CredentialIn(Input):
    role: Literal["tenant", "alerts"] = Field(
        default="tenant", description="tenant: submit and release its claims, read its statuses; "
                                      "alerts: read alerts only (claimbroker.v1.alerts.>, or with a tenant "
                                      "claimbroker.v1.alerts.*.*.<tenant>)")
    tenant: DnsLabel | None = Field(default=None, description="the tenant of a tenant credential; of an alerts "
                                                              "credential, the one tenant whose alerts it reads")

    @model_validator(mode="after")
    def _tenant_for_tenants(self) -> "CredentialIn":
        if self.role == "tenant" and self.tenant is None:
            raise ValueError("a tenant credential names its tenant")
        return self


class CredentialOut(Model):
    id: int
    user: str
    role: str
    tenant: str | None
    created_at: Stamp
    revoked_at: Stamp | None


class NewCredential(CredentialOut):
    password: str = Field(description="shown this once: only its bcrypt hash is kept")
    inbox_prefix: str = Field(description="the client's inbox prefix: replies and deliveries come only there")


async def _applied(request: Request) -> None:
    apply = getattr(request.app.state, "apply_bus_credentials", None)
    if apply is not None:
        await apply()


@router.get("/v1/credentials", response_model=list[CredentialOut], tags=["credentials"])
async def get_credentials(s: Session, token: Caller) -> list[CredentialOut]:
    """Every bus credential, revoked ones too; never a password."""
    admin(token)
    return [CredentialOut.model_validate(row) for row in await list_credentials(s)]


@router.post("/v1/credentials", response_model=NewCredential, status_code=201, tags=["credentials"])
async def post_credential(body: CredentialIn, request: Request, s: Session, token: Caller) -> NewCredential:
    admin(token)
    async with s.begin():
        password, row = await add_credential(s, body.role, body.tenant, actor=token.actor)
    await _applied(request)
    return NewCredential(password=password, inbox_prefix=bus_auth.inbox_prefix(row.user),
                         **CredentialOut.model_validate(row).model_dump())


@router.delete("/v1/credentials/{credential_id}", status_code=204, tags=["credentials"])
async def delete_credential(credential_id: Annotated[int, Path(ge=1, le=2**63 - 1)], request: Request, s: Session,
                            token: Caller) -> None:
    """Revoked, and its connections closed, before the answer where the API runs beside the server."""
    admin(token)
    async with s.begin():
        if await revoke_credential(s, credential_id, token.actor) is None:
            raise HTTPException(404, f"credential {credential_id} not found")
    await _applied(request)
