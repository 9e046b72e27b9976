"""JSON logs: one object a line with the record's extra fields; the batch lines only in JSON."""

from __future__ import annotations

import json
import logging

import pytest

from services.runtime.logs import BATCHES, JsonFormatter, configure


def test_a_json_line_carries_the_extra_fields_and_the_error() -> None:
    record = logging.LogRecord("claimbroker.allocator.batches", logging.INFO, __file__, 1, "decision batch", (),
                               None)
    record.messages, record.decided = 64, {"Allocated": 60, "Pending": 4}
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "decision batch" and line["level"] == "info" and line["messages"] == 64
    assert line["decided"] == {"Allocated": 60, "Pending": 4} and line["time"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "ValueError: boom" in json.loads(JsonFormatter().format(failed))["error"]


def test_batch_lines_are_written_in_json_and_left_out_in_text() -> None:
    root, batches = logging.getLogger(), logging.getLogger(BATCHES)
    saved = root.handlers[:], root.level, batches.level
    try:
        configure(True, "text")
        assert not batches.isEnabledFor(logging.INFO)
        configure(True, "json")
        assert batches.isEnabledFor(logging.INFO)
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        batches.setLevel(saved[2])


def test_the_nats_tls_eof_warning_is_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    configure(False)
    logging.getLogger("asyncio").warning("returning true from eof_received() has no effect when using ssl")
    logging.getLogger("asyncio").warning("something else")
    err = capsys.readouterr().err
    assert "eof_received" not in err and "something else" in err
