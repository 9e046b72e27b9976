"""Fixtures of the admin API's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.integration.admin import Api, admin_api


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Api]:
    async with admin_api(db_url) as opened:
        yield opened
