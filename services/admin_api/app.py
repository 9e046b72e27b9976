"""The admin API: tenants, cohorts, flavors, quotas, usage, claims, alerts and the audit log over the
SQL ledger, with bearer tokens, and the usage page at `/`.

Admin tokens write, viewer tokens read (a tenant-scoped viewer sees only its tenant). Every error is
application/problem+json. Every write is audited in the same transaction as the change itself. Routes
live in one module per resource; this module wires them to an engine and maps errors to problems. Heavy
requests (what-if, quota import and export) run in worker processes (offload.py); every body is bounded.
"""

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.admin_api import (
    alert_counts,
    claims,
    credentials,
    live,
    nodes,
    quotas,
    tenants,
    tokens,
    usage_history,
    waiting,
    whatif,
)
from services.admin_api.access import Session
from services.admin_api.fields import storable_parameters
from services.admin_api.live import LiveFeed
from services.admin_api.offload import AdminWorkers, BodyLimit, Limits, Reach, validation_detail
from services.admin_api.page import USAGE_PAGE
from services.admin_api.problems import Problem, phrase, problem
from shared.dra.inventory import Fleet
from shared.ledger.engine import sessions
from shared.ledger.errors import LEDGER_ERRORS
from shared.ledger.handles import AsyncEngine, ping


def create_app(engine: AsyncEngine, apply_bus_credentials: Callable[[], Awaitable[None]] | None = None,
               fleet: Callable[[], Awaitable[Fleet]] | None = None, pending_alert_after: float = 600.0,
               inventory_ttl: float = 90.0, live_feed: LiveFeed | None = None, limits: Limits | None = None,
               bus_url: str | None = None, tls_ca: Path | None = None,
               last_heard: Callable[[], Mapping[str, float] | None] | None = None) -> FastAPI:
    """Everything the app needs comes in through its arguments; nothing is read from the environment here.
    `apply_bus_credentials`: where the embedded NATS server runs in this process, what applies a change of
    bus credentials to it at once. `fleet`: the fleet the process sees (the node map; what-if's too when
    there is no `bus_url`). `pending_alert_after`: the broker's, for tenants without their own (the waiting
    view counts claims past it). `live_feed`: the broker's events for the page's live feed (/v1/events).
    `limits`: what heavy requests may ask and spend (the settings' defaults when None). `bus_url` (and
    `tls_ca`): where heavy requests' workers read the fleet themselves. `last_heard`: when each node of
    `fleet` was last heard, heartbeats included, where the fleet's own times are not that (the allocator's
    fleet); None, or a call that answers None: the fleet's times are (a fleet read from the bus)."""
    limits = limits or Limits.defaults()
    pool = AdminWorkers(limits, Reach(engine.url.render_as_string(hide_password=False), bus_url, tls_ca))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            pool.close()  # a job still running ends with the server

    # storable_parameters runs first on every route: a NUL in a path or query parameter is a 422, not a 500.
    app = FastAPI(title="claim-broker admin API", version="1", dependencies=[Depends(storable_parameters)],
                  lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=limits.max_body)
    app.state.workers = pool
    app.state.sessions = sessions(engine)
    app.state.apply_bus_credentials = apply_bus_credentials
    app.state.fleet = fleet
    app.state.pending_alert_after = pending_alert_after
    app.state.live = live_feed
    app.state.inventory_ttl = inventory_ttl  # a node heard from longer ago shows as stale on the node map
    app.state.last_heard = last_heard

    async def _http_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        status = error.status_code
        detail = error.detail if status < 500 else phrase(status)
        title = detail if isinstance(detail, str) and status < 500 else phrase(status)
        if isinstance(error, Problem):  # worded for the client, a 503's what-to-do included
            title, detail = error.title, error.detail
        return problem(status, title, detail, getattr(error, "headers", None))

    async def _invalid(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return problem(422, "invalid request", validation_detail(error.errors()))

    async def _crash(_: Request, __: Exception) -> JSONResponse:
        """Internals stay in the server log; the client learns only that it was not its fault."""
        return problem(500, "Internal Server Error", "the server failed; see its log")

    # FastAPI's HTTPException subclasses Starlette's, but both are named so neither path can slip past.
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(Exception, _crash)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def usage_page() -> HTMLResponse:
        """The page needs no token to load; it asks for one (or reads ?token=) before fetching data."""
        return HTMLResponse(USAGE_PAGE, headers={"Cache-Control": "no-store"})

    @app.get("/asyncapi.json", include_in_schema=False)
    async def asyncapi() -> JSONResponse:
        """The message contract (subjects and payloads), next to /openapi.json and public like it: it
        describes the bus, it holds no data."""
        from services.bus.asyncapi import document

        return JSONResponse(document())

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness only: the process answers. The ledger is /readyz's business."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "the ledger does not answer"}})
    async def readyz(s: Session) -> JSONResponse:
        try:
            await ping(s)
        except LEDGER_ERRORS as error:  # the ledger refuses or does not answer: not ready
            return problem(503, "ledger unavailable", type(error).__name__)
        return JSONResponse({"status": "ready"})

    app.include_router(tenants.router)
    app.include_router(usage_history.router)  # before /v1/usage's routes, which it extends
    app.include_router(quotas.router)
    app.include_router(alert_counts.router)
    app.include_router(claims.router)
    app.include_router(tokens.router)
    app.include_router(credentials.router)
    app.include_router(whatif.router)
    app.include_router(waiting.router)
    app.include_router(nodes.router)
    app.include_router(live.router)
    return app
