"""A PostgreSQL cluster of the tests' own, on a free port, so that it can be stopped and started under
running services: the machine's shared server cannot be restarted without taking every other user with it.

Built with the machine's `initdb` and `pg_ctl` (PATH, or Debian's /usr/lib/postgresql/<v>/bin). PostgreSQL
refuses to run as root, so as root the cluster runs as the `postgres` user. `unavailable()` says why a
machine cannot have one; the caller decides whether that skips, fails or falls back.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.e2e.helpers import free_port


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
                        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return str(candidates[-1]) if candidates else None


class PrivatePostgres:
    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="claimbroker-pg-"))
        self.data = self.root / "data"
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self._owner is not None:  # the cluster's files belong to the user it runs as
            os.chown(self.root, self._owner.pw_uid, self._owner.pw_gid)

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot run a private cluster, or None when it can."""
        for name in ("initdb", "pg_ctl"):
            if _binary(name) is None:
                return f"{name} is not installed"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return "running as root and there is no postgres user to run PostgreSQL as"
            if shutil.which("runuser") is None:
                return "running as root without runuser to run PostgreSQL as the postgres user"
        return None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, name: str, *args: str) -> None:
        command = [str(_binary(name)), *args]
        if self._owner is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args[:2])} failed: {(result.stderr or result.stdout).strip()}")

    def start(self) -> None:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w",
                  "start")

    def stop(self) -> None:
        """A fast shutdown: open transactions are rolled back and every client is disconnected, as in a
        restart by an operator."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
