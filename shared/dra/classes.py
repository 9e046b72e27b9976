"""The DeviceClasses NVIDIA's Helm chart installs; a file may add classes or replace one by name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.dra import v1 as dra


def _nvidia_class(name: str, device_type: str, extended_resource: str | None = None) -> dra.DeviceClass:
    expression = (
        f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{device_type}'"
    )
    return dra.DeviceClass.model_validate(
        {
            "apiVersion": dra.API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [{"cel": {"expression": expression}}],
                **({"extendedResourceName": extended_resource} if extended_resource else {}),
            },
        }
    )


BUILTIN_CLASSES: Mapping[str, dra.DeviceClass] = {
    "gpu.nvidia.com": _nvidia_class("gpu.nvidia.com", "gpu", "nvidia.com/gpu"),
    "mig.nvidia.com": _nvidia_class("mig.nvidia.com", "mig"),
}


def merge_classes(extra: Iterable[dra.DeviceClass]) -> dict[str, dra.DeviceClass]:
    classes = dict(BUILTIN_CLASSES)
    classes.update({c.metadata.name: c for c in extra})
    return classes
