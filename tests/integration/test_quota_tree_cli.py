"""`claimbroker quota usage`'s tables of fair share and of the cohort tree, from the admin API's usage answer
(tests/integration/test_quota_tree.py checks that answer against the ledger)."""

from __future__ import annotations

from typing import Any

from services.cli.admin import cohort_tree_table, share_table

SHARES = [{"tenant": "vision", "weight": 1.0, "inUse": 6.0, "pastUse": 4.0, "share": 10.0, "halvesIn": None},
          {"tenant": "speech", "weight": 2.0, "inUse": 4.0, "pastUse": 10.0, "share": 7.0, "halvesIn": 9000.0}]


def test_shares_show_past_use_and_when_it_halves_only_with_a_half_life() -> None:
    columns, rows = share_table({"halfLife": 86400.0, "shares": SHARES})
    assert columns == ["TENANT", "WEIGHT", "IN USE", "PAST USE", "SHARE", "HALVES IN"]
    assert rows == [["vision", 1.0, 6.0, 4.0, 10.0, "-"], ["speech", 2.0, 4.0, 10.0, 7.0, "2h30m"]]
    columns, rows = share_table({"halfLife": 0.0, "shares": SHARES})
    assert columns == ["TENANT", "WEIGHT", "IN USE", "SHARE"] and rows[0] == ["vision", 1.0, 6.0, 10.0]


def test_the_cohort_tree_indents_children_and_shows_used_of_nominal_per_level() -> None:
    def flavor(name: str, used: int, nominal: int, own: int, borrowing: int | None) -> dict[str, Any]:
        return {"flavor": name, "used": used, "nominal": nominal, "ownNominal": own, "borrowingLimit": borrowing,
                "lendingLimit": None}

    cohorts: list[dict[str, Any]] = [
        {"name": "org", "parent": None, "depth": 0, "flavors": [flavor("A100", 0, 4, 4, None),
                                                                flavor("H100", 5, 30, 16, 0)]},
        {"name": "research", "parent": "org", "depth": 1, "flavors": [flavor("H100", 5, 14, 8, 8)]},
        {"name": "idle", "parent": "org", "depth": 1, "flavors": []}]
    columns, rows = cohort_tree_table(cohorts)
    assert columns == ["COHORT", "FLAVOR", "USED / NOMINAL", "OWN NOMINAL/BORROW/LEND"]
    assert rows == [["org", "A100", "0 / 4", "4/-/-"], ["", "H100", "5 / 30", "16/0/-"],
                    ["  research", "H100", "5 / 14", "8/8/-"], ["  idle", "", "", ""]]
