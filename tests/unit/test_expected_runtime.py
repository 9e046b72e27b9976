"""claimbroker.io/expected-runtime: read strictly by settings_of (a duration, more than 0 and at most 365 days),
leniently by expected_runtime (a claim accepted before it was checked keeps being estimated without it)."""

from __future__ import annotations

import pytest

from shared.dra.claims import InvalidClaim, expected_runtime, read_submission, settings_of
from tests.builders import a_claim

ANNOTATION = "claimbroker.io/expected-runtime"


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None),
    ("90m", 5400.0),
    ("2h30m", 9000.0),
    ("45s", 45.0),
    ("1.5h", 5400.0),
    ("500ms", 0.5),
    ("8760h", 365 * 86400.0),
])
def test_expected_runtime_read(value: str | None, seconds: float | None) -> None:
    claim = a_claim().request().build()
    if value is not None:
        claim.metadata.annotations[ANNOTATION] = value
    assert settings_of(claim).expected_runtime == seconds
    assert expected_runtime(claim) == seconds


@pytest.mark.parametrize("value", ["0", "0s", "0m0s", "90", "90 minutes", "1d", "-5m", "8761h", "٣m", " 90m", "",
                                   "1e3s", "m"])
def test_bad_expected_runtime_rejects_the_claim_naming_annotation_and_value(value: str) -> None:
    claim = a_claim().request().build()
    claim.metadata.annotations[ANNOTATION] = value
    with pytest.raises(InvalidClaim) as raised:
        settings_of(claim)
    assert ANNOTATION in str(raised.value)
    assert "duration" in str(raised.value) and "365 days" in str(raised.value)
    assert expected_runtime(claim) is None  # read leniently: no estimate from it, no failure either


def test_a_submission_with_a_bad_expected_runtime_is_refused_by_name() -> None:
    payload = (b'{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "train", '
               b'"annotations": {"claimbroker.io/expected-runtime": "soon"}}, "spec": {"devices": {"requests": '
               b'[{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}')
    with pytest.raises(InvalidClaim) as raised:
        read_submission(payload, "vision")
    assert raised.value.name == "train"
    assert '"soon"' in str(raised.value) and ANNOTATION in str(raised.value)
