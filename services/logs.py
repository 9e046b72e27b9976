"""The services' log lines: text for a terminal, or one JSON object a line (`--log-format json`,
CLAIMBROKER_LOG_FORMAT=json) for a log pipeline. In JSON the allocator also writes one line per decision
batch (logger `claimbroker.allocator.batches`) with what it decided and how long it took; in text that
line is left out, as a terminal would scroll with it under load."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

BATCHES = "claimbroker.allocator.batches"
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message", ...the record's extra fields, "error" with a traceback}."""

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
        return json.dumps(line, default=str)


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
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logging.getLogger(BATCHES).setLevel(logging.WARNING)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # a line per plugin, every start
    asyncio_log = logging.getLogger("asyncio")
    if _not_nats_tls_eof not in asyncio_log.filters:
        asyncio_log.addFilter(_not_nats_tls_eof)
