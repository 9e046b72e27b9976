"""The incomplete-gang reason: what the allocator writes reads back as the same gang and numbers, and no
other reason reads as one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.contract.gang_reasons import IncompleteGang, incomplete_reason, read_incomplete, rejected_note


@pytest.mark.parametrize(("reason", "read"), [
    ("gang train-7: 3 of 4 members received", IncompleteGang("train-7", 3, 4)),
    ("gang g: 1 of 2 members received (b Rejected: a member with its name has to be submitted again)",
     IncompleteGang("g", 1, 2, ("b",))),
    ("gang g: 1 of 9 members received (a, b.c, d, e and 2 more Rejected: a member with its name has to be "
     "submitted again)", IncompleteGang("g", 1, 9, ("a", "b.c", "d", "e"), 2)),
    ("gang train-7 needs 32 GPUs on one nvidia.com/gpu.clique; the most free on one is 24", None),
    ("gang g: 1 of 2 members received; and more", None),
    ("gang G: 1 of 2 members received", None),  # a gang name is a DNS label
    ("waiting for 2 H100", None),
    ("", None),
    (None, None),
])
def test_read_incomplete(reason: str | None, read: IncompleteGang | None) -> None:
    assert read_incomplete(reason) == read


def test_the_text_is_the_contracts() -> None:
    """Tests and docs quote it: the builder must not drift."""
    assert incomplete_reason("train-7", 3, 4) == "gang train-7: 3 of 4 members received"
    assert incomplete_reason("g", 1, 2, rejected_note(["b"])) == (
        "gang g: 1 of 2 members received (b Rejected: a member with its name has to be submitted again)")
    assert rejected_note([]) == ""
    assert IncompleteGang("g", 3, 4).missing == 1


names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)


@given(gang=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True),
       have=st.integers(0, 256), size=st.integers(1, 256), rejected=st.lists(names, max_size=8, unique=True))
def test_what_is_built_reads_back(gang: str, have: int, size: int, rejected: list[str]) -> None:
    read = read_incomplete(incomplete_reason(gang, have, size, rejected_note(rejected)))
    assert read == IncompleteGang(gang, have, size, tuple(rejected[:4]), max(0, len(rejected) - 4))
