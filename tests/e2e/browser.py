"""Headless Chromium for the usage page's tests: `browse` dumps a page's DOM or screenshot after a budget of
virtual time; `Browser` drives one over the DevTools protocol on a pipe (--remote-debugging-pipe: commands
in on fd 3, replies out on fd 4, each a JSON text ended by a NUL), so a test can watch a live page in real
time: no WebSocket client, no browser download, no port to find."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--window-size=1200,900"]


def chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (make test installs Debian's chromium)")
        pytest.skip("chromium is not installed; `make test` installs it")
    return found


async def browse(binary: str, profile: Path, *args: str) -> str:
    """Chromium run once with `args` (--dump-dom URL, --screenshot=FILE URL) after 5 s of virtual time: the
    page's timers run, nothing waits on the clock."""
    process = await asyncio.create_subprocess_exec(
        binary, *FLAGS, "--virtual-time-budget=5000", f"--user-data-dir={profile}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


class Browser:
    def __init__(self, process: asyncio.subprocess.Process, commands: int, replies: asyncio.StreamReader) -> None:
        self._process, self._commands, self._replies = process, commands, replies
        self._next = 0
        self.session: str | None = None
        self.errors: list[str] = []  # the page's uncaught exceptions and console errors, as they were heard

    @classmethod
    async def open(cls, binary: str, profile: Path, url: str) -> Browser:
        """Chromium showing `url`, attached to its page."""
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Above the descriptors the child is given: placing them on 3 and 4 cannot overwrite each other.
        commands_in = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        replies_out = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)

        def onto_3_and_4() -> None:
            os.dup2(commands_in, 3)
            os.dup2(replies_out, 4)

        process = await asyncio.create_subprocess_exec(
            binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=onto_3_and_4)  # noqa: PLW1509 (a test helper, no threads forked)
        for fd in (to_browser_r, from_browser_w, commands_in, replies_out):
            os.close(fd)
        replies = asyncio.StreamReader(limit=1 << 26)
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(replies), os.fdopen(from_browser_r, "rb"))
        browser = cls(process, to_browser_w, replies)
        targets = await browser.send("Target.getTargets")
        page = next(t for t in targets["targetInfos"] if t["type"] == "page")
        attached = await browser.send("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        browser.session = attached["sessionId"]
        await browser.send("Page.enable")
        await browser.send("Runtime.enable")
        await browser.send("Emulation.setFocusEmulationEnabled", enabled=True)  # focus and keys as in a window
        await browser.send("Page.navigate", url=url)
        await browser.wait_for(f"location.origin === {json.dumps(url)}.slice(0, location.origin.length) && "
                               "document.readyState === 'complete'")
        return browser

    async def send(self, method: str, **params: Any) -> Any:
        self._next += 1
        ident = self._next
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:  # events and other replies are skipped (errors noted): one command at a time
            reply = json.loads((await self._replies.readuntil(b"\0"))[:-1])
            self._note(reply)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _note(self, event: dict[str, Any]) -> None:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(str(details.get("exception", {}).get("description") or details.get("text")))
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))

    async def resize(self, width: int, height: int) -> None:
        """The viewport of a screen of this size: a laptop's, a wall screen's."""
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                        mobile=False)

    async def press(self, key: str) -> None:
        """A key pressed and released where the focus is, as a keyboard would: "Enter", "Space", "Tab"."""
        codes = {"Enter": ("Enter", 13, "\r"), "Space": (" ", 32, " "), "Tab": ("Tab", 9, "")}
        name, code, text = codes[key]
        for kind in ("keyDown", "keyUp"):
            await self.send("Input.dispatchKeyEvent", type=kind, key=name, code=key, windowsVirtualKeyCode=code,
                            **({"text": text} if text and kind == "keyDown" else {}))

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited; asked again in the new
        document when a navigation replaced the one it ran in)."""
        for _ in range(50):
            try:
                result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True,
                                         returnByValue=True)
                break
            except RuntimeError as error:
                if "context" not in str(error).lower():
                    raise
        else:
            raise RuntimeError(f"{expression}: the page kept navigating")
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, condition: str, timeout: float = 20.0) -> Any:
        """The first truthy value of `condition`, checked in the page on every animation frame."""
        script = f"""new Promise(resolve => {{
            const check = () => {{ let v; try {{ v = ({condition}); }} catch (e) {{ v = null; }}
                                   if (v) resolve(v); else requestAnimationFrame(check); }};
            check(); }})"""
        return await asyncio.wait_for(self.evaluate(script), timeout)

    async def screenshot(self, path: Path, selector: str | None = None, *, viewport: bool = False) -> None:
        """The page, the element `selector` matches, or (`viewport`) the first screen, as a PNG."""
        import base64

        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": not viewport}
        if selector is not None and not viewport:
            box = await self.evaluate(f"""(() => {{ const r = document.querySelector({json.dumps(selector)})
                .getBoundingClientRect(); return {{x: r.x + scrollX, y: r.y + scrollY, width: r.width,
                height: r.height}}; }})()""")
            params["clip"] = {**box, "scale": 1}
        shot = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(shot["data"]))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.send("Browser.close"), 5)
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        await self._process.wait()
        os.close(self._commands)
