"""Pipelined publishing (services/bus/publish.py) on a real nats-server: every message stored in order, a
re-sent id dropped, and a publish JetStream refuses (no stream takes its subject, a stream that refuses it)
raises instead of counting as published."""

from __future__ import annotations

import nats
import pytest
from nats.js.errors import APIError, NoStreamResponseError

from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_pipelined

pytestmark = pytest.mark.e2e


async def test_pipelined_publishes_are_stored_in_order_once_and_refusals_raise(nats_server: EmbeddedNats) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="PIPELINED", subjects=["pipelined.>"])
        await publish_pipelined(js, [(f"pipelined.{n}", {"n": n}, f"id-{n}") for n in range(50)])
        await publish_pipelined(js, [(f"pipelined.{n}", {"n": n}, f"id-{n}") for n in range(45, 55)])
        stored = [(await js.get_msg("PIPELINED", seq)).data for seq in range(1, 56)]
        assert stored == [f'{{"n":{n}}}'.encode() for n in range(55)], "in order, ids 45-49 dropped as re-sent"

        with pytest.raises(NoStreamResponseError):
            await publish_pipelined(js, [("pipelined.1", {}, "id-x"), ("nowhere.1", {}, "id-y")])
        with pytest.raises(APIError):  # the stream does not allow per-message TTLs
            await publish_pipelined(js, [("pipelined.ttl", {}, "id-ttl")], ttls=[30.0])
        await publish_pipelined(js, [])
        await publish_pipelined(js, [("pipelined.last", {"n": "last"}, "id-last")])
        assert (await js.get_last_msg("PIPELINED", "pipelined.last")).data == b'{"n":"last"}'
    finally:
        await nc.close()
