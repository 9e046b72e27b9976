"""CEL as Kubernetes DRA evaluates it, on cel-python plus our rewrites and functions."""

from __future__ import annotations

import pytest

from shared.dra.cel import SelectorError, SemVer, compile_selector, device_activation, evaluate
from shared.dra.quantity import Quantity

DEVICE = device_activation(
    "gpu.nvidia.com",
    {"gpu.nvidia.com": {"productName": "NVIDIA H100 80GB HBM3", "type": "gpu",
                        "cudaComputeCapability": SemVer.parse("9.0.0")}},
    {"gpu.nvidia.com": {"memory": Quantity("81559Mi")}},
)
A = 'device.attributes["gpu.nvidia.com"]'
C = 'device.capacity["gpu.nvidia.com"]'


@pytest.mark.parametrize(("expression", "expected"), [
    (f'{A}.productName == "NVIDIA H100 80GB HBM3"', True),
    (f'{A}.productName.contains("H100")', True),
    (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', True),
    (f'{C}.memory.isGreaterThan(quantity("80Gi"))', False),
    (f'{C}.memory.isLessThan(quantity("100Gi"))', True),
    ('quantity("1Gi").add(quantity("1Gi")).compareTo(quantity("2048Mi")) == 0', True),
    (f'{C}.memory.asInteger() == 81559 * 1024 * 1024', True),
    ('isQuantity("80Gi") && !isQuantity("eighty")', True),
    (f'{A}.cudaComputeCapability.isGreaterThan(semver("8.0.0"))', True),
    (f'{A}.cudaComputeCapability.major() == 9', True),
    ('isSemver("1.2.3") && !isSemver("one")', True),
    (f'has({A}.profile)', False),
    ('device.attributes["amd.com"].size() == 0', True),
    (f'{A}.?profile.orValue("none") == "none"', True),
    (f'{A}.?type.orValue("none") == "gpu"', True),
    (f'{A}.?profile.hasValue()', False),
    (f'cel.bind(p, {A}.productName, p.startsWith("NVIDIA") && p.endsWith("HBM3"))', True),
    (f'cel.bind(a, {A}, has(a.productName) && !has(a.profile))', True),
    ('cel.bind(a, 1, cel.bind(a, a + 1, a)) == 2', True),  # an inner bind shadows an outer one
    ('cel.bind(x, 2, [1].all(y, cel.bind(z, x, z == y + 1)))', True),  # no capture of the macro's y
    ('cel.bind(y, 2, [1].all(y, y == 1))', True),
    (f'{C}.memory.isInteger() && {C}.memory.sign() == 1', True),
    ('quantity("500m").isInteger()', False),
    ('quantity("-1").sign() == -1 && quantity("0").sign() == 0', True),
    (f'device.driver == "other" && {A}.missing == 1', False),  # && absorbs the error, as in Kubernetes
], ids=lambda v: v if isinstance(v, str) and len(v) < 60 else None)
def test_kubernetes_cel(expression: str, expected: bool) -> None:
    assert evaluate(compile_selector(expression), DEVICE) is expected


@pytest.mark.parametrize(("expression", "message"), [
    (f"{A}.missing == 1", "no such member"),
    (f"{A}.productName", "must evaluate to bool"),
    ("device.attributes[", "CEL compile error"),
    ("cel.bind(1, 2, 3)", "cel.bind takes a variable name"),
    ("cel.bind(x, 2) == 2", "cel.bind takes a variable name"),
    ('quantity("500m").asInteger() == 0', "cannot be converted to an int64"),
    ("[1, 2].exists(1, true)", "must be a variable name"),
])
def test_errors_are_selector_errors(expression: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        evaluate(compile_selector(expression), DEVICE)
