"""Fixtures of the admin API's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.integration.admin import Api, admin_api


@pytest.fixture
async def api(ledger_url: str) -> AsyncIterator[Api]:
    """On a ledger already at the newest schema (tests/conftest.py): its `migrate` changes nothing."""
    async with admin_api(ledger_url) as opened:
        yield opened
