"""Status publishing (`make bench-publish`): why the allocator publishes statuses on its broker's nats-py
connection (services/runtime/service_app.py). On a nats-server of its own (embedded, file storage, the
contract's streams), `--messages` status-sized messages with Nats-Msg-Id headers, in batches of `--batch` (as
a decision batch leaves them), three ways:

- `faststream-each`: a FastStream NatsBroker's `publish(..., stream=...)`, each PubAck awaited in turn;
- `faststream-gather`: the same calls, a batch's publishes awaited together (asyncio.gather);
- `nats-py-pipelined`: `services.bus.publish.publish_pipelined` on the broker's connection (every publish sent,
  then the acknowledgements awaited together).

One JSON line each: {"way", "messages", "per_s", "ms_per_batch"}. Run: `make bench-publish`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faststream.nats import NatsBroker  # noqa: E402

from services.bus.embedded import EmbeddedNats  # noqa: E402
from services.bus.publish import publish_pipelined  # noqa: E402
from services.bus.streams import ensure_streams  # noqa: E402
from shared.contract import subjects  # noqa: E402


def status(serial: int) -> dict[str, Any]:
    return {"apiVersion": "claimbroker.io/v1", "tenant": f"t{serial % 20}", "name": f"c{serial}", "sequence": 1,
            "state": "Pending", "reason": "Insufficient nvidia.com/gpu: requested 2, free 0 of 8 on 500 nodes",
            "observedAt": "2026-12-06T09:00:00Z"}


async def run(way: str, broker: NatsBroker, messages: int, batch: int, run_id: str) -> float:
    js = broker.connection.jetstream()
    started = time.perf_counter()
    for first in range(0, messages, batch):
        items = [(subjects.status(f"t{i % 20}", f"c{i}"), status(i), f"{run_id}-{way}-{i}")
                 for i in range(first, min(messages, first + batch))]
        if way == "faststream-each":
            for subject, payload, message_id in items:
                await broker.publish(payload, subject, headers={"Nats-Msg-Id": message_id},
                                     stream=subjects.STATUS_STREAM)
        elif way == "faststream-gather":
            await asyncio.gather(*(broker.publish(payload, subject, headers={"Nats-Msg-Id": message_id},
                                                  stream=subjects.STATUS_STREAM)
                                   for subject, payload, message_id in items))
        else:
            await publish_pipelined(js, items)
    return time.perf_counter() - started


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="claimbroker-bench-publish-") as folder:
        server = EmbeddedNats(Path(folder) / "nats")
        url = await asyncio.to_thread(server.start)
        try:
            broker = NatsBroker(url, log_level=10)
            await broker.connect()
            await ensure_streams(broker.connection.jetstream())
            run_id = str(time.time_ns())
            for way in ("faststream-each", "faststream-gather", "nats-py-pipelined"):
                seconds = await run(way, broker, args.messages, args.batch, run_id)
                print(json.dumps({"way": way, "messages": args.messages, "per_s": round(args.messages / seconds),
                                  "ms_per_batch": round(seconds * 1000 / -(-args.messages // args.batch), 1)}),
                      flush=True)
            await broker.stop()
        finally:
            await asyncio.to_thread(server.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=512)
    asyncio.run(main(parser.parse_args()))
