"""TLS with a self-signed pair: `up`'s embedded nats-server and the admin API serve TLS, the services and the
CLI trust the pair's CA through CLAIMBROKER_TLS_CA, and a client that does not trust it is refused."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from pathlib import Path

import httpx
import pytest
import trustme
import yaml

from services.runtime.stack import running_stack
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import free_port

pytestmark = pytest.mark.e2e


def pair(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signs for 127.0.0.1: (ca, cert, key) as PEM files."""
    authority = trustme.CA()
    server = authority.issue_cert("127.0.0.1", "localhost")
    ca, cert, key = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    authority.cert_pem.write_to_path(str(ca))
    server.private_key_and_cert_chain_pem.write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    return ca, cert, key


async def cli(*args: str, ca: Path | None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAIMBROKER_")}
    if ca is not None:
        env["CLAIMBROKER_TLS_CA"] = str(ca)
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "services.cli", *args, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_the_stack_over_tls_and_a_client_without_the_ca_refused(tmp_path: Path) -> None:
    ca, cert, key = pair(tmp_path)
    settings = BrokerSettings(data_dir=tmp_path / "data", api_port=free_port(), tls_ca=ca, api_tls_cert=cert,
                              api_tls_key=key, nats_tls_cert=cert, nats_tls_key=key)
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump(a_claim("one", "vision").request().document()))
    async with running_stack(settings, services=("watcher", "allocator", "admin-api")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)  # its NATS is TLS
        code, out, err = await cli("--nats", stack.admin_url, "submit", str(claims), "--wait", "20", ca=ca)
        assert code == 0 and json.loads(out)["state"] == "Allocated", err
        code, _, err = await cli("--nats", stack.admin_url, "status", ca=None)
        assert code == 3 and "cannot reach NATS" in err, err  # the server's certificate is not trusted

        assert stack.api_url is not None and stack.api_url.startswith("https://")
        for _ in range(100):
            try:
                async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
                    response = await client.get(stack.api_url + "/healthz")
                break
            except httpx.ConnectError:
                await asyncio.sleep(0.1)  # uvicorn still starting
        assert response.status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            async with httpx.AsyncClient() as client:
                await client.get(stack.api_url + "/healthz")
