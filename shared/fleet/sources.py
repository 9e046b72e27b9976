"""Reading inventory files: ResourceSlices, DeviceClasses and Topology documents, several per file.

Errors name the file, the document and the field, because operators fix them by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared.dra import model as dra


class InventoryFileError(ValueError):
    pass


@dataclass
class InventoryDocuments:
    slices: list[dra.ResourceSlice] = field(default_factory=list)
    classes: list[dra.DeviceClass] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)

    def nodes(self) -> list[str]:
        return sorted({s.spec.node_name for s in self.slices if s.spec.node_name} | set(self.labels))


BUILTIN_TOPOLOGY: dict[str, Any] = {
    "kind": "Topology",
    "nodes": [
        {"name": "node-01", "gpuModel": "A100", "gpuCount": 4, "numaNodes": 2,
         "nodeLabels": {"nvidia.com/gpu.product": "A100", "run.ai/simulated-gpu-node-pool": "default"}},
        {"name": "node-02", "gpuModel": "H100", "gpuCount": 8, "numaNodes": 2,
         "nodeLabels": {"nvidia.com/gpu.product": "H100"}},
        {"name": "node-03", "gpuModel": "H200", "gpuCount": 8, "numaNodes": 2,
         "nodeLabels": {"nvidia.com/gpu.product": "H200"}},
        {"name": "node-04", "gpuModel": "B200", "gpuCount": 8, "numaNodes": 2,
         "nodeLabels": {"nvidia.com/gpu.product": "B200"}},
        {"name": "node-05", "gpuModel": "A100-40GB", "gpuCount": 4, "numaNodes": 1,
         "nodeLabels": {"nvidia.com/gpu.product": "A100-40GB"}},
        {"name": "node-06", "gpuModel": "H100", "gpuCount": 2, "numaNodes": 1,
         "nodeLabels": {"nvidia.com/gpu.product": "H100", "nvidia.com/mig.strategy": "mixed"},
         "mig": {0: "all-1g.10gb", 1: ["3g.40gb", "3g.40gb"]}},
    ],
}


def _node_name_problem(resource_slice: dra.ResourceSlice) -> str | None:
    """A node is named as Kubernetes names it, a DNS subdomain: its inventory's subject carries it (a '.'
    written '_'), and its claims' allocations name it."""
    node = resource_slice.spec.node_name
    if node is None or dra.is_dns_subdomain(node):
        return None
    return f"{dra.shown(node)} {dra.DNS_SUBDOMAIN_RULE}, as Kubernetes requires of a node's name"


def documents_from(raw: Iterable[Any], origin: str) -> InventoryDocuments:
    out = InventoryDocuments()
    for index, document in enumerate(raw):
        where = f"{origin}: document {index + 1}"
        if document is None:
            continue
        if isinstance(document, dict) and document.get("kind") == "Topology":
            from shared.fleet import topology

            try:
                generated = topology.topology_to_resource_slices(document)
                labels = topology.topology_node_labels(document)
            except ValueError as error:
                raise InventoryFileError(f"{where} (Topology): {error}") from None
            for slice_doc in generated:
                out.slices.append(dra.ResourceSlice.model_validate(slice_doc))
            out.labels.update(labels)
            continue
        try:
            obj = dra.parse_object(document)
        except dra.DocumentError as error:
            raise InventoryFileError(f"{where}: {error}") from None
        if isinstance(obj, dra.ResourceSlice):
            if (problem := _node_name_problem(obj)) is not None:
                raise InventoryFileError(f"{where}: spec.nodeName: {problem}")
            out.slices.append(obj)
        elif isinstance(obj, dra.DeviceClass):
            out.classes.append(obj)
        else:
            raise InventoryFileError(f"{where}: kind: a ResourceClaim is not inventory; pass it with --claims")
    return out


def load_yaml_documents(path: Path) -> list[Any]:
    try:
        return list(yaml.safe_load_all(path.read_text()))
    except OSError as error:
        raise InventoryFileError(f"{path}: cannot read: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise InventoryFileError(f"{path}: not valid YAML: {error}") from None


def load_inventory(paths: Iterable[Path]) -> InventoryDocuments:
    """All files together; with no files, the built-in mixed fleet."""
    paths = list(paths)
    if not paths:
        return documents_from([BUILTIN_TOPOLOGY], "built-in fleet")
    merged = InventoryDocuments()
    for path in paths:
        part = documents_from(load_yaml_documents(path), str(path))
        merged.slices.extend(part.slices)
        merged.classes.extend(part.classes)
        merged.labels.update(part.labels)
    return merged
