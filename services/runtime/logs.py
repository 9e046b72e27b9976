"""The services' log lines: text for a terminal, or one JSON object a line (`--log-format json`,
CLAIMBROKER_LOG_FORMAT=json) for a log pipeline. In JSON the allocator also writes one line per decision
batch (logger `claimbroker.allocator.batches`) with what it decided and how long it took; in text that
line is left out, as a terminal would scroll with it under load.

Every line written is masked (`mask_secrets`): a URL's or DSN's password, whoever put it in the message,
an exception's text or an extra field (nats-py, SQLAlchemy and asyncpg quote their URLs in errors), never
reaches a log. It is the last line of defence: the code that builds a message shows URLs redacted already.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

BATCHES = "claimbroker.allocator.batches"
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

# scheme://USERINFO@ in free text: USERINFO ends at the last '@' before a '/', a space or a quote, so an
# unencoded '@' in a password is masked with the rest; each URL of a comma-separated list is its own match
_USERINFO = re.compile(r"""(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#'"<>\\]+)@""")
# a NATS URL's userinfo without a ':' is a token, itself the secret (nats://TOKEN@host)
_TOKEN_SCHEMES = frozenset({"nats://", "tls://", "ws://", "wss://"})
# libpq's key=value DSN and URL query parameters (password=...), and an HTTP bearer token
_KEYED = re.compile(r"""(?i)\b(?P<key>password|passwd|pwd)(?P<sep>\s*=\s*|['"]?\s*:\s*['"]?)"""
                    r"""(?P<value>'[^']*'|"[^"]*"|[^\s&;,)'"]+)""")
_BEARER = re.compile(r"(?i)\b(Bearer\s+)[A-Za-z0-9._~+/=-]+")
MASK = "***"


def _userinfo(match: re.Match[str]) -> str:
    scheme, userinfo = match["scheme"], match["userinfo"]
    if ":" in userinfo:
        return f"{scheme}{userinfo.split(':', 1)[0]}:{MASK}@"
    return f"{scheme}{MASK}@" if scheme.lower() in _TOKEN_SCHEMES else match[0]


def mask_secrets(text: str) -> str:
    """`text` with every credential it carries replaced by ***: a URL's password (`nats://user:***@host`,
    `postgresql://user:***@host/db`), a NATS token (`nats://***@host`), `password=***` of a key=value DSN
    or a query, a bearer token. Under a microsecond for a line of 120 characters, 3 us for one of 1.3 KB."""
    if "@" in text:
        text = _USERINFO.sub(_userinfo, text)
    lower = text.lower()  # the keyed forms are looked for only where their words are
    if "pass" in lower or "pwd" in lower:
        text = _KEYED.sub(lambda m: f"{m['key']}{m['sep']}{MASK}", text)
    if "bearer" in lower:
        text = _BEARER.sub(lambda m: f"{m[1]}{MASK}", text)
    return text


def url_origin(url: str) -> str:
    """`scheme://host[:port]/...`: a URL as a log line names it where its path is the secret (a Slack
    webhook's is), and never with a password."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    return f"{parts.scheme}://{parts.hostname or ''}{port}" + ("/..." if parts.path.strip("/") else "")


class TextFormatter(logging.Formatter):
    """A terminal's line, masked (`mask_secrets`), its traceback included."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


class OneLineFormatter(logging.Formatter):
    """`name: message: ExceptionType: text` on one line, masked: what a command line's own warnings look
    like (its errors are one line, never a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line += f": {type(error).__name__}: {error}"
        return mask_secrets(" ".join(line.split()))


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message", ...the record's extra fields, "error" with a traceback},
    masked (`mask_secrets`)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return mask_secrets(json.dumps(line, default=str))


def _not_nats_tls_eof(record: logging.LogRecord) -> bool:
    """nats-py's protocol returns True from eof_received, which asyncio's TLS transport warns about on every
    TLS connection to NATS; it says nothing an operator can act on."""
    return not record.getMessage().startswith("returning true from eof_received() has no effect when using ssl")


def configure(verbose: bool, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
        logging.getLogger(BATCHES).setLevel(logging.NOTSET)
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logging.getLogger(BATCHES).setLevel(logging.WARNING)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # a line per plugin, every start
    logging.getLogger("watchfiles").setLevel(logging.WARNING)  # a line per file system event it sees
    asyncio_log = logging.getLogger("asyncio")
    if _not_nats_tls_eof not in asyncio_log.filters:
        asyncio_log.addFilter(_not_nats_tls_eof)


def mask_last_resort() -> None:
    """A process that configured no logging (an admin job's worker) writes through logging's last resort:
    masked too."""
    logging.lastResort = logging.lastResort or logging.StreamHandler(sys.stderr)
    logging.lastResort.setFormatter(TextFormatter("%(name)s %(levelname)s %(message)s"))


def configure_command_line() -> None:
    """A command's own logging, until a command that runs services configures theirs (`configure`):
    warnings and errors of the libraries it uses, one masked line each on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    asyncio_log = logging.getLogger("asyncio")
    if _not_nats_tls_eof not in asyncio_log.filters:
        asyncio_log.addFilter(_not_nats_tls_eof)
