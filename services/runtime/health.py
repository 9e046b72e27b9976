"""Liveness and readiness over HTTP for a service run on its own (`serve X`, with CLAIMBROKER_HEALTH_PORT):
what Kubernetes probes and compose healthchecks ask. /healthz answers while the process's event loop runs;
/readyz answers 200 when the service says it is ready, else 503 with why (NATS away, no inventory yet,
decision cycles failing: masked, as a dependency's error may quote its URL); /metrics answers Prometheus's
text format (services/runtime/metrics.py). GET only, nothing else served."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from services.runtime.logs import mask_secrets
from services.runtime.metrics import exposition

_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


TEXT = "text/plain; charset=utf-8"


def answer(path: str, not_ready: Callable[[], str | None],
           other_metrics: Callable[[], list[bytes]] = list) -> tuple[int, str, str]:
    """Status, body and content type for a path. `other_metrics`: other processes' own series, served
    with this one's (under `up`, the allocator's and the start estimates' processes)."""
    if path == "/healthz":
        return 200, "ok", TEXT
    if path == "/readyz":
        why = not_ready()
        return (200, "ready", TEXT) if why is None else (503, mask_secrets(why), TEXT)
    if path == "/metrics":
        body, content_type = exposition(*other_metrics())
        return 200, body.decode(), content_type
    return 404, "not found", TEXT


async def serve_health(host: str, port: int, not_ready: Callable[[], str | None],
                       other_metrics: Callable[[], list[bytes]] = list) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while await asyncio.wait_for(reader.readline(), 5) not in (b"\r\n", b"\n", b""):
                pass  # headers: nothing in them matters here
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) > 1 else "/"
            status, body, content_type = answer(path, not_ready, other_metrics)
            data = body.encode()
            writer.write(f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):  # the client went first
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port)
    async with server:
        await server.serve_forever()
