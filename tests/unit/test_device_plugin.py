"""Device-plugin nodes (capacity + GFD labels) become the devices NVIDIA's DRA driver would publish."""

from __future__ import annotations

from typing import Any

import pytest

from shared.dra import model as dra
from shared.dra.inventory import devices_from_slices
from shared.fleet.device_plugin import node_slices, pack_mig, product_name
from shared.fleet.topology import lookup_model

H100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
               "nvidia.com/gpu.count": "8", "nvidia.com/mig.strategy": "none"}


def devices(node: str, labels: dict[str, str], capacity: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for document in node_slices(node, labels, capacity):
        parsed = dra.parse_object(document)  # what the allocator will parse: must be a valid ResourceSlice
        assert isinstance(parsed, dra.ResourceSlice) and parsed.spec.node_name == node
        for device in document["spec"].get("devices", []):
            out[device["name"]] = device
    return out


@pytest.mark.parametrize(
    ("labels", "capacity", "expected"),
    [
        # plain device plugin: one device per nvidia.com/gpu, the driver's product string and memory
        (H100_LABELS, {"nvidia.com/gpu": "8", "cpu": "96"}, [f"gpu-{i}" for i in range(8)]),
        # no GPUs in capacity: nothing, whatever the labels say
        (H100_LABELS, {"cpu": "96", "nvidia.com/gpu": "0"}, []),
        # GPUs without GFD labels: the broker cannot describe them, so nothing
        ({}, {"nvidia.com/gpu": "2"}, []),
        # mixed strategy: whole GPUs first, MIG instances packed onto the rest with NVIDIA's placements
        ({**H100_LABELS, "nvidia.com/gpu.count": "2", "nvidia.com/mig.strategy": "mixed"},
         {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.40gb": "2"},
         ["gpu-0", "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4"]),
        ({**H100_LABELS, "nvidia.com/gpu.count": "2", "nvidia.com/mig.strategy": "mixed"},
         {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-4g.40gb": "1",
          "nvidia.com/mig-2g.20gb": "1"},
         ["gpu-0-mig-4g40gb-5-0", "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-1g10gb-19-6",
          *[f"gpu-1-mig-1g10gb-19-{start}" for start in range(6)]]),
        # single strategy: the product label names the profile and nvidia.com/gpu counts MIG instances
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/gpu.memory": "19968",
          "nvidia.com/mig.strategy": "single"}, {"nvidia.com/gpu": "4"},
         ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4", "gpu-1-mig-3g20gb-9-0", "gpu-1-mig-3g20gb-9-4"]),
    ],
    ids=["whole-gpus", "no-gpus", "no-gfd-labels", "mixed-one-mig-gpu", "mixed-all-mig", "single"],
)
def test_node_to_devices(labels: dict[str, str], capacity: dict[str, Any], expected: list[str]) -> None:
    assert sorted(devices("gpu-node-1", labels, capacity)) == sorted(expected)


def test_attributes_match_what_the_dra_driver_publishes() -> None:
    found = devices("gpu-node-1", H100_LABELS, {"nvidia.com/gpu": "2"})
    gpu = found["gpu-1"]
    attributes = {k: next(iter(v.values())) for k, v in gpu["attributes"].items()}
    assert attributes["type"] == "gpu"
    assert attributes["productName"] == "NVIDIA H100 80GB HBM3"
    assert attributes["architecture"] == "Hopper"
    assert attributes["cudaComputeCapability"] == "9.0.0"
    assert attributes["uuid"].startswith("GPU-")
    assert gpu["capacity"]["memory"] == {"value": "81559Mi"}
    assert found["gpu-0"]["attributes"]["uuid"] != gpu["attributes"]["uuid"]


def test_mig_devices_carry_profile_parent_and_memory_slices() -> None:
    labels = {**H100_LABELS, "nvidia.com/gpu.count": "1", "nvidia.com/mig.strategy": "mixed"}
    found = devices("gpu-node-1", labels, {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "1"})
    mig = found["gpu-0-mig-3g40gb-9-0"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert mig["attributes"]["parentUUID"]["string"].startswith("GPU-")
    assert {f"memorySlice{s}" for s in range(4)} <= set(mig["capacity"])


def test_node_names_that_are_dns_subdomains_are_kept() -> None:
    node = "ip-10-0-1-17.eu-west-1.compute.internal"
    slices = node_slices(node, H100_LABELS, {"nvidia.com/gpu": "1"})
    assert slices[0]["spec"]["nodeName"] == node and slices[0]["spec"]["pool"]["name"] == node
    parsed = [s for s in map(dra.parse_object, slices) if isinstance(s, dra.ResourceSlice)]
    assert [d.name for d in devices_from_slices(parsed)[node]] == ["gpu-0"]
    other = node_slices("ip-10-0-1-18.eu-west-1.compute.internal", H100_LABELS, {"nvidia.com/gpu": "1"})
    uuid = slices[0]["spec"]["devices"][0]["attributes"]["uuid"]
    assert uuid != other[0]["spec"]["devices"][0]["attributes"]["uuid"]  # unique per node


def test_unknown_model_or_profile_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="Tesla-T4"):
        node_slices("n", {"nvidia.com/gpu.product": "Tesla-T4"}, {"nvidia.com/gpu": "1"})
    with pytest.raises(ValueError, match="9g.99gb"):
        node_slices("n", {**H100_LABELS, "nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/mig-9g.99gb": "1"})


def test_product_name_and_packing_helpers() -> None:
    h100 = lookup_model("H100")
    assert product_name("NVIDIA-H100-80GB-HBM3", h100) == "NVIDIA H100 80GB HBM3"
    assert product_name("NVIDIA-H100-PCIe", h100) == "NVIDIA H100 PCIe"
    by_name = {p.name: p for p in h100.profiles}
    layouts = pack_mig([by_name["4g.40gb"], by_name["4g.40gb"], by_name["1g.10gb"]], 1)
    assert [[p.name for p in layout] for layout in layouts] == [["4g.40gb", "1g.10gb"], ["4g.40gb"]]
