"""The NVML source on a stand-in NVML module (same function names, injected): devices named and described
as NVIDIA's DRA driver does, telemetry in the contract's shape, and the shared health rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.watcher.nvml import NvmlReader, NvmlWatcher
from shared.dra import model as dra
from shared.dra.inventory import devices_from_slices
from shared.fleet import telemetry


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801 - pynvml's name
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801 - pynvml's name
    pass


@dataclass
class FakeMig:
    profile: str
    profile_id: int
    start: int
    size: int
    memory_mib: int
    sms: int
    uuid: str


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_mib: int = 81559
    bus: str = "00000000:18:00.0"
    temperature: int = 41
    reasons: int = 0x1  # GpuIdle
    ecc: int | Exception = 0
    migs: list[FakeMig] = field(default_factory=list)
    lost: bool = False


class FakeNvml:
    """The pynvml functions the source calls, over a list of fake GPUs."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialised = 0

    def nvmlInit(self) -> None:  # noqa: N802
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "580.105.08"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return 13000

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        gpu = self.gpus[index]
        if gpu.lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        return gpu

    def nvmlDeviceGetName(self, handle: Any) -> bytes:  # noqa: N802 - old pynvml returned bytes
        if isinstance(handle, tuple):
            return f"{handle[0].name} MIG {handle[1].profile}".encode()
        return handle.name.encode()

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return handle[1].uuid if isinstance(handle, tuple) else handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:  # noqa: N802
        mib = handle[1].memory_mib if isinstance(handle, tuple) else handle.memory_mib
        return SimpleNamespace(total=mib * 2**20, used=0, free=mib * 2**20)

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:  # noqa: N802
        return SimpleNamespace(busId=handle.bus.encode())

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:  # noqa: N802
        return (9, 0)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeGpu) -> int:  # noqa: N802
        raise NVMLError_NotSupported("not supported")

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> tuple[int, int]:  # noqa: N802
        return (1, 1) if handle.migs else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, slot: int) -> Any:  # noqa: N802
        if slot >= len(handle.migs):
            raise NVMLError_NotFound("not found")
        return (handle, handle.migs[slot])

    def nvmlDeviceGetGpuInstanceId(self, mig: Any) -> int:  # noqa: N802
        return mig[0].migs.index(mig[1]) + 1

    def nvmlDeviceGetGpuInstanceById(self, handle: FakeGpu, gi: int) -> Any:  # noqa: N802
        return handle.migs[gi - 1]

    def nvmlGpuInstanceGetInfo(self, instance: FakeMig) -> Any:  # noqa: N802
        return SimpleNamespace(profileId=instance.profile_id,
                               placement=SimpleNamespace(start=instance.start, size=instance.size))

    def nvmlDeviceGetAttributes(self, mig: Any) -> Any:  # noqa: N802
        m = mig[1]
        return SimpleNamespace(multiprocessorCount=m.sms, sharedCopyEngineCount=m.size // 2 or 1,
                               sharedDecoderCount=1, sharedEncoderCount=0, sharedJpegCount=1, sharedOfaCount=0,
                               gpuInstanceSliceCount=m.size, memorySizeMB=m.memory_mib)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:  # noqa: N802
        return handle.temperature

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:  # noqa: N802
        return handle.reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, kind: int, counter: int) -> int:  # noqa: N802
        if isinstance(handle.ecc, Exception):
            raise handle.ecc
        return handle.ecc


def fleet() -> list[FakeGpu]:
    return [
        FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", bus="00000000:18:00.0"),
        FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", bus="00000000:29:00.0", temperature=88,
                reasons=0x20 | 0x4, ecc=NVMLError_NotSupported("ECC off")),
        FakeGpu(uuid="GPU-cccccccc-0000-0000-0000-000000000000", bus="00000000:3A:00.0", ecc=2, migs=[
            FakeMig("3g.40gb", 9, 4, 4, 40448, 60, "MIG-11111111-0000-0000-0000-000000000000"),
            FakeMig("1g.10gb", 19, 0, 1, 9984, 16, "MIG-22222222-0000-0000-0000-000000000000"),
        ]),
    ]


def test_devices_named_and_described_like_the_dra_driver(tmp_path: Path) -> None:
    reading = NvmlReader(FakeNvml(fleet()), "gpu-host-1", sysfs=tmp_path).read()
    (document,) = reading.slices
    parsed = dra.parse_object(document)
    assert isinstance(parsed, dra.ResourceSlice)
    assert parsed.spec.node_name == "gpu-host-1" and parsed.spec.driver == "gpu.nvidia.com"
    names = [d["name"] for d in document["spec"]["devices"]]
    assert names == ["gpu-0", "gpu-1", "gpu-2-mig-1g10gb-19-0", "gpu-2-mig-3g40gb-9-4"]
    gpu0 = {k: next(iter(v.values())) for k, v in document["spec"]["devices"][0]["attributes"].items()}
    assert gpu0 == {
        "type": "gpu", "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "productName": "NVIDIA H100 80GB HBM3",
        "brand": "Nvidia", "architecture": "Hopper", "cudaComputeCapability": "9.0.0",
        "driverVersion": "580.105.8", "cudaDriverVersion": "13.0.0", "numa-node": 0,
        "resource.kubernetes.io/pciBusID": "0000:18:00.0",
    }
    assert document["spec"]["devices"][0]["capacity"] == {"memory": {"value": "81559Mi"}}
    mig = document["spec"]["devices"][3]
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert mig["attributes"]["parentUUID"] == {"string": "GPU-cccccccc-0000-0000-0000-000000000000"}
    assert mig["attributes"]["uuid"] == {"string": "MIG-11111111-0000-0000-0000-000000000000"}
    assert {f"memorySlice{s}" for s in (4, 5, 6, 7)} <= set(mig["capacity"])
    assert mig["capacity"]["memory"] == {"value": "40448Mi"}
    # what the allocator reads back: MIG devices only for the GPU in MIG mode
    assert [d.name for d in devices_from_slices([parsed])["gpu-host-1"]] == names


def test_telemetry_shape_and_health_rule(tmp_path: Path) -> None:
    reading = NvmlReader(FakeNvml(fleet()), "gpu-host-1", sysfs=tmp_path).read()
    wire = telemetry.to_json(reading.telemetry)
    assert wire["devices"]["gpu-0"] == {"health": "Healthy", "temperatureC": 41, "throttleReasons": ["GpuIdle"],
                                        "eccUncorrected": 0}
    assert wire["devices"]["gpu-1"] == {"health": "Throttled", "temperatureC": 88,
                                        "throttleReasons": ["SwPowerCap", "SwThermalSlowdown"],
                                        "eccUncorrected": 0}  # ECC not supported is no error
    # uncorrected ECC on the parent: every MIG device of it is Unhealthy
    assert wire["devices"]["gpu-2-mig-3g40gb-9-4"]["health"] == "Unhealthy"
    assert wire["devices"]["gpu-2-mig-1g10gb-19-0"]["eccUncorrected"] == 2
    assert telemetry.from_json(wire) == reading.telemetry


def test_a_gpu_that_fails_nvml_stays_published_as_unhealthy(tmp_path: Path) -> None:
    gpus = fleet()
    reader = NvmlReader(FakeNvml(gpus), "gpu-host-1", sysfs=tmp_path)
    reader.read()
    gpus[0].lost = True
    gpus[1].ecc = NVMLError("Unknown Error")
    reading = reader.read()
    assert [d["name"] for d in reading.slices[0]["spec"]["devices"]][:2] == ["gpu-0", "gpu-1"]
    assert reading.telemetry["gpu-0"].health == "Unhealthy" and "lost" in (reading.telemetry["gpu-0"].error or "")
    assert reading.telemetry["gpu-1"].health == "Unhealthy"


def test_a_driver_that_stops_answering_keeps_known_gpus_as_unhealthy(tmp_path: Path) -> None:
    nvml = FakeNvml(fleet())
    reader = NvmlReader(nvml, "gpu-host-1", sysfs=tmp_path)
    before = reader.read()

    def broken() -> int:
        raise NVMLError("Driver Not Loaded")

    nvml.nvmlDeviceGetCount = broken  # type: ignore[method-assign]
    after = reader.read()
    assert after.slices == before.slices
    assert {t.health for t in after.telemetry.values()} == {"Unhealthy"}
    with pytest.raises(NVMLError):
        NvmlReader(nvml, "gpu-host-2", sysfs=tmp_path).read()  # nothing known yet: the error is the answer


def test_pcie_root_and_numa_node_from_sysfs(tmp_path: Path) -> None:
    device = tmp_path / "devices" / "pci0000:10" / "0000:10:01.0" / "0000:18:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:18:00.0").symlink_to(device)
    reading = NvmlReader(FakeNvml(fleet()[:1]), "gpu-host-1", sysfs=tmp_path).read()
    attributes = reading.slices[0]["spec"]["devices"][0]["attributes"]
    assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:10"}
    assert attributes["numa-node"] == {"int": 1}


@pytest.mark.parametrize(
    ("ecc", "reasons", "error", "expected"),
    [
        (0, (), False, "Healthy"),
        (0, ("GpuIdle", "SwPowerCap", "ApplicationsClocksSetting"), False, "Healthy"),
        (0, ("HwSlowdown",), False, "Throttled"),
        (0, ("SwThermalSlowdown",), False, "Throttled"),
        (0, ("HwThermalSlowdown",), False, "Throttled"),
        (0, ("HwPowerBrakeSlowdown",), False, "Throttled"),
        (1, ("HwSlowdown",), False, "Unhealthy"),
        (0, (), True, "Unhealthy"),
    ],
)
def test_health_rule(ecc: int, reasons: tuple[str, ...], error: bool, expected: str) -> None:
    assert telemetry.health_of(ecc_uncorrected=ecc, throttle_reasons=reasons, error=error) == expected


def test_throttle_reason_names_and_tolerant_reader() -> None:
    assert telemetry.throttle_reason_names(0x8 | 0x80 | 0x1) == ("GpuIdle", "HwSlowdown", "HwPowerBrakeSlowdown")
    assert telemetry.from_json({"devices": {"gpu-0": {"health": "Weird"}}})["gpu-0"].health == "Unhealthy"
    assert telemetry.from_json(None) == {} and telemetry.to_json({}) == {}


class RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[tuple[str, list[dra.ResourceSlice], dict[str, Any]]] = []
        self.removed: list[str] = []

    async def publish(self, node: str, slices: list[dra.ResourceSlice], *, labels: dict[str, str],
                      telemetry: dict[str, Any]) -> bool:
        self.published.append((node, slices, telemetry))
        return True

    async def remove(self, node: str) -> bool:
        self.removed.append(node)
        return True


async def test_watcher_publishes_the_host_and_removes_it_when_gpus_go(tmp_path: Path) -> None:
    nvml = FakeNvml(fleet())
    publisher = RecordingPublisher()
    watcher = NvmlWatcher(publisher, "gpu-host-1", nvml=nvml, sysfs=tmp_path)  # type: ignore[arg-type]
    reader = NvmlReader(nvml, "gpu-host-1", sysfs=tmp_path)
    assert await watcher.publish_once(reader)
    node, slices, wire = publisher.published[0]
    assert node == "gpu-host-1" and len(slices[0].spec.devices) == 4
    assert set(wire["devices"]) == {d.name for d in slices[0].spec.devices}
    nvml.gpus.clear()
    assert await watcher.publish_once(reader)
    assert publisher.removed == ["gpu-host-1"]
