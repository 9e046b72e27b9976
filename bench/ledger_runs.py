"""What the ledger benchmarks share: one empty database per queue depth (SQLite in a temporary directory,
or the database `--url` names, for one depth), one JSON line per depth."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine


def run_depths(doc: str, run: Callable[[str, int], Awaitable[dict[str, Any]]]) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", help="an empty database (default: SQLite in a temporary directory)")
    parser.add_argument("--depth", type=int, action="append", help="queue depth (repeatable without --url)")
    args = parser.parse_args()
    depths = args.depth or [1000, 10_000]
    if args.url and len(depths) != 1:
        parser.error("--url takes one --depth (the database must start empty)")
    for depth in depths:
        with tempfile.TemporaryDirectory() as scratch:
            url = args.url or f"sqlite+aiosqlite:///{scratch}/ledger.db"
            print(json.dumps(asyncio.run(run(url, depth))), flush=True)


async def maintain(engine: AsyncEngine) -> None:
    """What autovacuum does for a running ledger: planner statistics and a visibility map. A database filled
    in seconds has neither, and PostgreSQL then scans the claims table for the rows written since the last
    cycle and for the count of queued rows (7 and 5 ms a transaction at a depth of 10,000)."""
    async with engine.connect() as connection:
        await (await connection.execution_options(isolation_level="AUTOCOMMIT")).exec_driver_sql("VACUUM ANALYZE")
