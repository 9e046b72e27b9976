"""Inventory from the GPUs of this host, read with NVML (`nvidia-ml-py`, module `pynvml`).

For a GPU host that runs no DRA driver, or to add health to the inventory: the devices get the names and
attributes NVIDIA's DRA driver gives them (`gpu-<i>`, `gpu-<i>-mig-<profile>-<giProfileId>-<start>`,
same attribute names as shared/fleet/topology.py), and every device carries telemetry (temperature, clock
throttle reasons, volatile uncorrected ECC errors) with the health verdict of shared/fleet/telemetry.py.

`pynvml` is imported lazily, so machines without a GPU or a driver can import this module; NVML is read
in a worker thread because its calls block. The module object is injectable, which is how it is tested.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.bus.streams import ensure_streams
from services.runtime.outage import Outage, until_done
from services.watcher.publish import InventoryPublisher
from shared.dra import model as dra
from shared.fleet import telemetry, topology

log = logging.getLogger("claimbroker.watcher.nvml")

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_DEVICE_MIG_ENABLE = 1
# nvmlDeviceGetArchitecture values, for GPUs the broker has no model table for.
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada",
                 9: "Hopper", 10: "Blackwell"}
_MIG_NAME = re.compile(r"MIG (\d+g\.\d+gb(?:\+me)?)")


def load_nvml() -> Any:
    import pynvml  # lazy: a ctypes wrapper that only loads libnvidia-ml when nvmlInit runs

    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _version(text: str) -> str:
    """'580.105.08' -> '580.105.8': DRA version attributes are semver, which forbids leading zeros."""
    parts = [str(int(p)) for p in re.findall(r"\d+", text)[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def _cuda_version(value: int) -> str:
    return f"{value // 1000}.{value % 1000 // 10}.0"


def _bus_id(raw: Any) -> str:
    """NVML says '00000000:18:00.0'; the driver and sysfs say '0000:18:00.0'."""
    text = _text(raw).lower()
    domain, _, rest = text.partition(":")
    return f"{domain[-4:]}:{rest}" if rest else text


@dataclass
class HostReading:
    slices: list[dict[str, Any]]
    telemetry: dict[str, telemetry.DeviceTelemetry]


@dataclass
class NvmlReader:
    """One read of the host per call; remembers each GPU's last good description so a GPU that starts
    failing NVML calls is still published, as Unhealthy, instead of silently vanishing."""

    nvml: Any
    node: str
    sysfs: Path = Path("/sys")
    last_devices: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def _not_supported(self, error: Exception) -> bool:
        not_supported = getattr(self.nvml, "NVMLError_NotSupported", None)
        return not_supported is not None and isinstance(error, not_supported)

    def _optional(self, call: Callable[[], Any], default: Any) -> Any:
        """A reading the GPU does not support (ECC on consumer boards, NUMA on one-socket hosts) is a
        default, not a fault."""
        try:
            return call()
        except self.nvml.NVMLError as error:
            if self._not_supported(error):
                return default
            raise

    def read(self) -> HostReading:
        n = self.nvml
        try:
            driver = _version(_text(n.nvmlSystemGetDriverVersion()))
            cuda = _cuda_version(int(n.nvmlSystemGetCudaDriverVersion()))
            count = int(n.nvmlDeviceGetCount())
        except n.NVMLError as error:
            if not self.last_devices:
                raise
            # the driver stopped answering: the GPUs we knew are still there, but nobody should get them
            log.warning("NVML error: %s; marking every known GPU Unhealthy", error)
            known = [d for i in sorted(self.last_devices) for d in self.last_devices[i]]
            failed = telemetry.DeviceTelemetry.observe(temperature_c=0, throttle_reasons=(), ecc_uncorrected=0,
                                                       error=str(error))
            return HostReading(self._slices(known), {d["name"]: failed for d in known})
        devices: list[dict[str, Any]] = []
        readings: dict[str, telemetry.DeviceTelemetry] = {}
        for index in range(count):
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
                described = self._describe(handle, index, driver, cuda)
                self.last_devices[index] = described
                health = self._health(handle)
            except n.NVMLError as error:
                log.warning("GPU %d: NVML error: %s", index, error)
                described = self.last_devices.get(index, [])
                health = telemetry.DeviceTelemetry.observe(temperature_c=0, throttle_reasons=(),
                                                           ecc_uncorrected=0, error=str(error))
            devices.extend(described)
            readings.update({d["name"]: health for d in described})  # MIG devices share their GPU's health
        return HostReading(self._slices(devices), readings)

    def _slices(self, devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One slice, one pool named after the node, as the driver publishes a node's GPUs; none without GPUs."""
        if not devices:
            return []
        return [{
            "apiVersion": dra.API_VERSION, "kind": "ResourceSlice",
            "metadata": {"name": f"{self.node}-{topology.DRIVER}"},
            "spec": {"driver": topology.DRIVER, "nodeName": self.node,
                     "pool": {"name": self.node, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
        }]

    def _health(self, handle: Any) -> telemetry.DeviceTelemetry:
        n = self.nvml
        temperature = int(self._optional(lambda: n.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU), 0))
        reasons_call = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = int(self._optional(lambda: reasons_call(handle), 0))
        ecc = int(self._optional(lambda: n.nvmlDeviceGetTotalEccErrors(
            handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC), 0))
        return telemetry.DeviceTelemetry.observe(
            temperature_c=temperature, throttle_reasons=telemetry.throttle_reason_names(mask), ecc_uncorrected=ecc)

    def _describe(self, handle: Any, index: int, driver: str, cuda: str) -> list[dict[str, Any]]:
        n = self.nvml
        name = _text(n.nvmlDeviceGetName(handle))
        try:
            model: topology.GpuModel | None = topology.lookup_model(name)
        except ValueError:
            model = None
        major, minor = n.nvmlDeviceGetCudaComputeCapability(handle)
        bus = _bus_id(n.nvmlDeviceGetPciInfo(handle).busId)
        architecture = model.architecture if model else ARCHITECTURES.get(
            int(self._optional(lambda: n.nvmlDeviceGetArchitecture(handle), -1)), "Unknown")
        common: dict[str, Any] = {
            "productName": {"string": name},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture},
            "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
            "driverVersion": {"version": driver},
            "cudaDriverVersion": {"version": cuda},
            "numa-node": {"int": self._numa_node(handle, bus)},
            "resource.kubernetes.io/pciBusID": {"string": bus},
        }
        if (root := self._pcie_root(bus)) is not None:
            common["resource.kubernetes.io/pcieRoot"] = {"string": root}
        gpu_uuid = _text(n.nvmlDeviceGetUUID(handle))
        current, _pending = self._optional(lambda: n.nvmlDeviceGetMigMode(handle), (0, 0))
        if current != NVML_DEVICE_MIG_ENABLE:
            memory = int(n.nvmlDeviceGetMemoryInfo(handle).total) // 2**20
            return [{"name": f"gpu-{index}",
                     "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid}, **common},
                     "capacity": {"memory": {"value": f"{memory}Mi"}}}]
        return self._mig_devices(handle, index, gpu_uuid, model, common)

    def _mig_devices(self, handle: Any, index: int, gpu_uuid: str, model: topology.GpuModel | None,
                     common: dict[str, Any]) -> list[dict[str, Any]]:
        """In MIG mode a GPU is offered as its MIG devices only (as the DRA driver does)."""
        n = self.nvml
        by_id = {p.gi_profile_id: p.name for p in model.profiles} if model else {}
        devices = []
        for slot in range(int(n.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except n.NVMLError:
                continue  # an empty slot is NVML_ERROR_NOT_FOUND
            gpu_instance = n.nvmlDeviceGetGpuInstanceById(handle, n.nvmlDeviceGetGpuInstanceId(mig))
            instance = n.nvmlGpuInstanceGetInfo(gpu_instance)
            attrs = n.nvmlDeviceGetAttributes(mig)
            start, size = int(instance.placement.start), int(instance.placement.size)
            memory = int(n.nvmlDeviceGetMemoryInfo(mig).total) // 2**20
            named = _MIG_NAME.search(_text(n.nvmlDeviceGetName(mig)))
            profile = named[1] if named else by_id.get(int(instance.profileId),
                                                       f"{attrs.gpuInstanceSliceCount}g.{round(memory / 1024)}gb")
            capacity: dict[str, Any] = {
                "multiprocessors": {"value": str(attrs.multiprocessorCount)},
                "copyEngines": {"value": str(attrs.sharedCopyEngineCount)},
                "decoders": {"value": str(attrs.sharedDecoderCount)},
                "encoders": {"value": str(attrs.sharedEncoderCount)},
                "jpegEngines": {"value": str(attrs.sharedJpegCount)},
                "ofaEngines": {"value": str(attrs.sharedOfaCount)},
                "memory": {"value": f"{memory}Mi"},
                **{f"memorySlice{s}": {"value": "1"} for s in range(start, start + size)},
            }
            devices.append({
                "name": f"gpu-{index}-mig-{re.sub(r'[^a-z0-9]', '', profile)}-{instance.profileId}-{start}",
                "attributes": {"type": {"string": "mig"}, "uuid": {"string": _text(n.nvmlDeviceGetUUID(mig))},
                               "parentUUID": {"string": gpu_uuid}, "profile": {"string": profile}, **common},
                "capacity": capacity,
            })
        return sorted(devices, key=lambda d: d["name"])

    def _numa_node(self, handle: Any, bus: str) -> int:
        getter = getattr(self.nvml, "nvmlDeviceGetNumaNodeId", None)
        if getter is not None:
            try:
                return max(0, int(getter(handle)))
            except self.nvml.NVMLError:
                pass
        try:
            return max(0, int((self.sysfs / "bus/pci/devices" / bus / "numa_node").read_text()))
        except (OSError, ValueError):
            return 0

    def _pcie_root(self, bus: str) -> str | None:
        """The PCI root complex, as the DRA driver finds it: the first component under /sys/devices."""
        path = Path(os.path.realpath(self.sysfs / "bus/pci/devices" / bus))
        parts = path.relative_to(self.sysfs).parts if path.is_relative_to(self.sysfs) else ()
        return parts[1] if len(parts) > 2 and parts[0] == "devices" and parts[1].startswith("pci") else None


class NvmlWatcher:
    """Polls NVML and publishes this host's inventory when it changes (health included), with heartbeats."""

    def __init__(self, publisher: InventoryPublisher, node: str, *, poll_interval: float = 10.0,
                 nvml: Any = None, sysfs: Path = Path("/sys")) -> None:
        self.publisher = publisher
        self.node = node
        self.poll_interval = poll_interval
        self.nvml = nvml
        self.sysfs = sysfs

    async def publish_once(self, reader: NvmlReader) -> bool:
        reading = await asyncio.to_thread(reader.read)
        if not reading.slices:  # a host without GPUs publishes nothing (and a removal if it had some)
            return await self.publisher.remove(self.node)
        slices = [s for s in map(dra.parse_object, reading.slices) if isinstance(s, dra.ResourceSlice)]
        return await self.publisher.publish(self.node, slices, labels={},
                                            telemetry=telemetry.to_json(reading.telemetry))

    async def run(self) -> None:
        nats = Outage("NATS", log)
        await until_done(lambda: ensure_streams(self.publisher.js), nats)
        nvml = self.nvml if self.nvml is not None else load_nvml()
        await asyncio.to_thread(nvml.nvmlInit)
        reader = NvmlReader(nvml, self.node, self.sysfs)
        try:
            while True:
                try:
                    try:
                        await self.publish_once(reader)
                    except nvml.NVMLError as error:  # the driver itself is in trouble: keep trying
                        log.error("NVML read failed: %s", error)
                    await self.publisher.heartbeat()
                except Exception as error:  # the poll loop's guard: NATS restarting or gone, the next poll tries again
                    await nats.failed(error)
                    continue
                nats.ok()
                await asyncio.sleep(min(self.poll_interval, max(0.05, self.publisher.due_in())))
        finally:
            await asyncio.to_thread(nvml.nvmlShutdown)
