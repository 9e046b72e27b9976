"""Run one hostile case in a forked child, so that a crash, a hang or a blown stack is a finding, not the end
of the test run: the child inherits everything built so far (fleet, warmed caches) copy-on-write, answers
through a pipe, and is killed when it overruns its time."""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Crash:
    """An exception that escaped (or a child that hung or died), and where it was raised."""

    kind: str  # the exception's type, or "Timeout" / "Died"
    message: str
    where: str  # the innermost frame in shared/ or services/, else the innermost frame

    def __str__(self) -> str:
        return f"{self.kind}: {self.message} (at {self.where})"


def crash_of(error: BaseException) -> Crash:
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if f.filename.startswith(os.path.join(ROOT, "shared"))
            or f.filename.startswith(os.path.join(ROOT, "services"))]
    chosen = ours or frames
    where = "?"
    if chosen:
        frame = chosen[-1]
        where = f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno} in {frame.name}"
    message = str(error)
    if len(message) > 300:
        message = message[:300] + "..."
    return Crash(type(error).__name__, message, where)


def run_isolated(fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
    """fn(*args) in a forked child: its picklable result, or a Crash."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running the parent's cleanup
        os.close(read_end)
        try:
            try:
                answer: Any = fn(*args)
            except BaseException as error:  # whatever escapes is the finding
                answer = crash_of(error)
            data = pickle.dumps(answer)
        except BaseException as error:  # an answer that cannot be pickled
            data = pickle.dumps(Crash(type(error).__name__, str(error)[:300], "pickling the answer"))
        with os.fdopen(write_end, "wb") as out:
            out.write(data)
        sys.stdout.flush()
        os._exit(0)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([pipe], [], [], left)
            if ready:
                chunk = pipe.read(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return Crash("Timeout", f"no answer within {timeout:g}s", "?")
    if not chunks:
        return Crash("Died", f"the child ended with status {status:#x} and no answer", "?")
    return pickle.loads(b"".join(chunks))
