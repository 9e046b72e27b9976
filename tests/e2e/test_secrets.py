"""No password on screen or in a log (issue 36: `top --once` with the server stopped printed the bus admin's
URL with its password). Each failure path is driven for real and everything it wrote (stdout, stderr, logs,
/readyz) is searched for the secret."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from services.bus.embedded import EmbeddedNats
from services.runtime.stack import running_stack
from shared.contract import bus_auth
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import free_port

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "services.cli"]
DEADLINE_S = 60.0


def a_secret() -> str:
    return f"pw-{uuid.uuid4().hex[:16]}"


async def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(*CLI, *args, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(process.communicate(), DEADLINE_S)
    return process.returncode or 0, out.decode(), err.decode()


def up_data_folder(folder: Path, password: str) -> Path:
    """What `up` leaves in its data folder, its servers stopped: the NATS and API URLs, the bus admin's
    password and an admin token."""
    from services.bus.authority import ADMIN_PASSWORD_FILE

    folder.mkdir(parents=True)
    (folder / "nats.url").write_text(f"nats://127.0.0.1:{free_port()}")
    (folder / "api.url").write_text(f"http://127.0.0.1:{free_port()}")
    (folder / ADMIN_PASSWORD_FILE).write_text(password)
    (folder / "admin.token").write_text("cb_test_token")
    return folder


@pytest.mark.parametrize("command", [["top", "--once"], ["status"], ["submit", "CLAIMS"], ["release", "x"],
                                     ["whatif"], ["advise", "mig"]])
async def test_commands_in_a_stopped_brokers_folder_hide_the_admin_password(tmp_path: Path,
                                                                            command: list[str]) -> None:
    secret = a_secret()
    folder = up_data_folder(tmp_path / "data", secret)
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump(a_claim("one", "t").request().document()))
    code, out, err = await run("--data-dir", str(folder), *[str(claims) if a == "CLAIMS" else a for a in command])
    assert code == 3 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"nats://{bus_auth.admin_user()}:***@127.0.0.1:" in err  # the URL is named, its password masked
    assert secret not in out + err


async def test_a_refused_password_is_not_repeated(tmp_path: Path) -> None:
    """A wrong password (and the right one of another identity) in --nats: refused in one line, masked."""
    secret = a_secret()
    async with running_stack(BrokerSettings(data_dir=tmp_path / "data"), services=("allocator",)) as stack:
        url = bus_auth.url_with_user(stack.nats_url, bus_auth.admin_user(), secret)
        for command in (["status"], ["release", "x", "--tenant", "t"], ["status", "x", "-o", "json"]):
            code, out, err = await run("--nats", url, *command)
            assert code == 1 and "the server refused the credential" in err, (command, err)
            assert secret not in out + err and ":***@" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["migrate"], ["token", "create", "--role", "viewer"], ["up", "--api-port", "0"],
                                     ["whatif", "--nats", "NATS"]])
async def test_an_unreachable_ledger_hides_its_password(nats_server: EmbeddedNats, tmp_path: Path,
                                                        command: list[str]) -> None:
    secret = a_secret()
    url = f"postgresql://postgres:{secret}@127.0.0.1:{free_port()}/ledger"  # nothing listens there
    arguments = [nats_server.url if a == "NATS" else a for a in command]
    if command[0] == "whatif":  # it reads the fleet from the bus first, then the ledger
        from services.bus.connection import connect
        from services.bus.streams import ensure_streams

        nc = await connect(nats_server.url, name="test")
        await ensure_streams(nc.jetstream())
        await nc.close()
    code, out, err = await run("--data-dir", str(tmp_path / "data"), *arguments, "--db", url)
    assert code == 3 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "postgres:***@127.0.0.1" in err and secret not in out + err


@pytest.fixture
def nats_with_auth(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, str]]:
    """A nats-server as deployed beside the broker: every client needs a credential; the bus admin's URL."""
    from services.bus.authority import own_identities

    secret = a_secret()
    server = EmbeddedNats(tmp_path / "external-nats",
                          accounts=bus_auth.render_accounts(own_identities({"admin": secret}), [],
                                                            bus_auth.TenantLimits()))
    url = server.start()
    yield server, bus_auth.url_with_user(url, bus_auth.admin_user(), secret)
    server.stop()


async def test_up_on_an_external_nats_that_refuses_or_is_gone_says_so_at_once(
        nats_with_auth: tuple[EmbeddedNats, str], tmp_path: Path) -> None:
    """Not a silent wait for good: one line, the URL masked, nothing created."""
    _, url = nats_with_auth
    secret = url.split(":")[2].split("@")[0]
    wrong = url.replace(secret, a_secret())
    gone = f"nats://cbuser:{secret}@127.0.0.1:{free_port()}"
    for nats, status, said in ((wrong, 1, "the server refused the credential"), (gone, 3, "cannot reach NATS")):
        code, out, err = await run("--data-dir", str(tmp_path / "data"), "up", "--nats", nats, "--api-port", "0")
        assert code == status and said in err and len(err.strip().splitlines()) == 1, err
        assert secret not in out + err and not (tmp_path / "data").exists()


async def test_up_with_credentials_in_its_urls_shows_none(nats_with_auth: tuple[EmbeddedNats, str],
                                                          tmp_path: Path) -> None:
    """`up` on an external NATS whose URL carries a password: the banner masks it, /readyz while NATS is
    down says why without it, the log lines of the outage leave it out, a command in its folder too; the
    URL file that holds it is the owner's alone."""
    nats_server, external = nats_with_auth
    secret = external.split(":")[2].split("@")[0]
    port = int(external.rsplit(":", 1)[1])
    health = free_port()
    folder = tmp_path / "data"
    env = {**os.environ, "CLAIMBROKER_HEALTH_PORT": str(health)}
    up = await asyncio.create_subprocess_exec(*CLI, "--data-dir", str(folder), "up", "--nats", external,
                                              "--api-port", "0", stdout=asyncio.subprocess.PIPE,
                                              stderr=asyncio.subprocess.PIPE, env=env)
    banner = ""
    try:
        assert up.stdout is not None
        while "health" not in banner:  # the banner's last line
            line = (await asyncio.wait_for(up.stdout.readline(), DEADLINE_S)).decode()
            assert line, "up ended before its banner"
            banner += line
        assert f"NATS      nats://{bus_auth.admin_user()}:***@127.0.0.1:{port}" in banner
        assert (folder / "nats.url").stat().st_mode & 0o077 == 0  # it holds the password: the owner's only

        async def readyz(wanted: int) -> str:
            async with httpx.AsyncClient() as client:
                for _ in range(int(DEADLINE_S / 0.1)):
                    response = await client.get(f"http://127.0.0.1:{health}/readyz")
                    if response.status_code == wanted:
                        return response.text
                    await asyncio.sleep(0.1)
            raise AssertionError(f"/readyz never answered {wanted}")

        await readyz(200)
        await asyncio.to_thread(nats_server.stop)
        why = await readyz(503)
        assert secret not in why
        code, out, err = await run("--data-dir", str(folder), "status")
        assert code == 3 and secret not in out + err and f"{bus_auth.admin_user()}:***@" in err, err
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGTERM)
        rest, logs = await asyncio.wait_for(up.communicate(), DEADLINE_S)
    logged = banner + rest.decode() + logs.decode()
    assert "lost; reconnecting" in logged or "unreachable" in logged  # the outage was logged
    assert secret not in logged


@pytest.mark.parametrize("log_format", ["text", "json", "command line", "no handler (an admin job's worker)"])
def test_a_log_line_with_an_exception_masks_every_credential(log_format: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The last line of defence: whatever a message, an exception's text (SQLAlchemy's and nats-py's quote
    their URLs) or an extra field carries, the line written has no password, token or bearer."""
    from services.runtime.logs import configure, configure_command_line, mask_last_resort

    secrets = [a_secret() for _ in range(5)]
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    saved_format = logging.lastResort.formatter if logging.lastResort is not None else None
    try:
        if log_format == "command line":
            configure_command_line()
        elif log_format.startswith("no handler"):
            root.handlers[:] = []
            mask_last_resort()
        else:
            configure(True, log_format)
        try:
            raise ConnectionError(f"could not connect to postgresql+asyncpg://ledger:{secrets[0]}@db:5432/ledger "
                                  f"(host=db password={secrets[1]})")
        except ConnectionError as error:
            logging.getLogger("claimbroker.test").error("NATS at nats://admin.local:%s@127.0.0.1:4222 failed: %s",
                                                        secrets[2], error, exc_info=error,
                                                        extra={"url": f"nats://{secrets[3]}@host:4222"})
        logging.getLogger("claimbroker.test").warning("sent Authorization: Bearer %s", secrets[4])
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        if logging.lastResort is not None:
            logging.lastResort.setFormatter(saved_format)
    err = capsys.readouterr().err
    assert "ledger:***@db" in err and "admin.local:***@" in err and "password=***" in err and "Bearer ***" in err
    assert not [s for s in secrets if s in err], err
    if log_format == "command line":
        assert len(err.strip().splitlines()) == 2  # one line a record, no traceback


def test_readyz_masks_what_a_dependency_said() -> None:
    from services.runtime.health import answer

    secret = a_secret()
    status, body, _ = answer("/readyz", lambda: f"ledger unreachable for 3s (OperationalError: postgresql://u:"
                                                f"{secret}@db/ledger refused)")
    assert status == 503 and secret not in body and "u:***@db" in body
