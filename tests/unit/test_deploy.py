"""Deployment files parse, and the watcher's RBAC grants exactly what it reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shared.contract import bus_auth

ROOT = Path(__file__).resolve().parents[2]


def documents(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_every_manifest_parses_and_kustomization_lists_them() -> None:
    k8s = ROOT / "deploy" / "k8s"
    listed = set(documents(k8s / "kustomization.yaml")[0]["resources"])
    assert listed == {p.name for p in k8s.glob("*.yaml")} - {"kustomization.yaml"}
    for path in k8s.glob("*.yaml"):
        assert all("kind" in d for d in documents(path)), path
    compose = documents(ROOT / "compose.yaml")[0]["services"]
    assert set(compose) == {"nats", "postgres", "migrate", "watcher", "allocator", "estimator", "notifier",
                            "admin-api"}


def test_watcher_rbac_is_read_only_on_nodes_and_resource_slices() -> None:
    """Exactly what services/watcher/kube.py lists and watches; no wildcards, no other objects or verbs."""
    docs = documents(ROOT / "deploy" / "k8s" / "rbac-watcher.yaml")
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])  # no resourceNames etc.
    grants = [(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
              for v in rule["verbs"]]
    assert sorted(grants) == [("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),
                              ("resource.k8s.io", "resourceslices", "get"),
                              ("resource.k8s.io", "resourceslices", "list"),
                              ("resource.k8s.io", "resourceslices", "watch")]
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "claim-broker"}]


def grants_of(path: Path) -> tuple[list[tuple[str, str, str]], dict[str, Any], dict[str, Any], dict[str, Any]]:
    docs = documents(path)
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])  # no resourceNames etc.
    grants = sorted((g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
                    for v in rule["verbs"])
    return grants, role, next(d for d in docs if d["kind"] == "ClusterRoleBinding"), next(
        d for d in docs if d["kind"] == "ServiceAccount")


def test_allocator_rbac_grants_exactly_what_the_cluster_write_back_calls() -> None:
    """services/allocator/cluster_claims.py: follow claims and gated pods, patch a claim's finalizer and
    annotations, update its status, patch a pod's gate away and its condition, evict pods, write events;
    nothing else (no delete, no create of claims or pods, no secrets, no wildcards)."""
    grants, role, binding, account = grants_of(ROOT / "deploy" / "k8s" / "rbac-allocator.yaml")
    assert grants == sorted([
        ("resource.k8s.io", "resourceclaims", "get"), ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"), ("resource.k8s.io", "resourceclaims", "patch"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"),
        ("", "pods/status", "patch"), ("", "pods/eviction", "create"), ("", "events", "create")])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "claim-broker"}]
    allocator = documents(ROOT / "deploy" / "k8s" / "allocator.yaml")[0]["spec"]["template"]["spec"]
    assert allocator["serviceAccountName"] == account["metadata"]["name"]
    assert "--kube" in allocator["containers"][0]["args"]
    # the calls made (services/kube/requests.py's methods, the reflectors' lists and watches), one grant each
    source = (ROOT / "services" / "allocator" / "cluster_claims.py").read_text()
    calls = {"list_resource_claim_for_all_namespaces": ("resource.k8s.io", "resourceclaims", "list"),
             "read_claim": ("resource.k8s.io", "resourceclaims", "get"),
             "patch_claim": ("resource.k8s.io", "resourceclaims", "patch"),
             "replace_claim_status": ("resource.k8s.io", "resourceclaims/status", "update"),
             "list_pod_for_all_namespaces": ("", "pods", "list"), "requests.patch_pod,": ("", "pods", "patch"),
             "patch_pod_status": ("", "pods/status", "patch"), "evict_pod": ("", "pods/eviction", "create"),
             "create_event": ("", "events", "create")}
    for call, grant in calls.items():
        assert call in source, call
        assert grant in grants, grant
    watched = {(group, resource, "watch") for group, resource, verb in calls.values() if verb == "list"}
    assert set(grants) == set(calls.values()) | watched, "a grant no call needs"  # both ways


def test_each_service_is_probed_where_serve_answers() -> None:
    """The probes ask the port CLAIMBROKER_HEALTH_PORT gives `serve`, on the paths services.runtime.health serves."""
    from services.runtime.health import answer

    config = documents(ROOT / "deploy" / "k8s" / "config.yaml")[0]["data"]
    port = int(config["CLAIMBROKER_HEALTH_PORT"])
    for component in ("allocator", "estimator", "notifier", "watcher"):
        deployment = next(d for d in documents(ROOT / "deploy" / "k8s" / f"{component}.yaml")
                          if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": port}
        for probe in ("readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] == "health" and answer(get["path"], lambda: None)[0] == 200, (component, probe)


def test_every_service_is_scraped_where_it_serves_metrics() -> None:
    from services.runtime.health import answer

    port = documents(ROOT / "deploy" / "k8s" / "config.yaml")[0]["data"]["CLAIMBROKER_HEALTH_PORT"]
    for component in ("admin-api", "allocator", "estimator", "notifier", "watcher"):
        deployment = next(d for d in documents(ROOT / "deploy" / "k8s" / f"{component}.yaml")
                          if d["kind"] == "Deployment")
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == port
        assert answer(annotations["prometheus.io/path"], lambda: None)[0] == 200, component
        ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert {"name": "health", "containerPort": int(port)} in ports, component


def test_the_grafana_dashboard_asks_only_for_metrics_the_services_export() -> None:
    """Every series a panel queries is one services/runtime/metrics.py defines: a renamed metric breaks this test,
    not the dashboard of an operator."""
    import json
    import re

    from prometheus_client import REGISTRY

    import services.runtime.metrics  # noqa: F401 - registers them

    exported = {s.name for m in REGISTRY.collect() if m.name.startswith("claimbroker_") for s in m.samples}
    exported |= {m.name for m in REGISTRY.collect() if m.name.startswith("claimbroker_")}
    exported |= {f"{m.name}_bucket" for m in REGISTRY.collect() if m.type == "histogram"}
    exported |= {f"{m.name}_total" for m in REGISTRY.collect() if m.type == "counter"}
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "claim-broker.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel.get("targets", [])
               for name in re.findall(r"claimbroker_[a-z_]+", target["expr"])}
    assert queried and queried <= exported, queried - exported


def test_nats_runs_three_servers_that_keep_three_replicas_and_sync_every_write() -> None:
    docs = {d["kind"] + "/" + d["metadata"]["name"]: d for d in documents(ROOT / "deploy" / "k8s" / "nats.yaml")}
    servers = docs["StatefulSet/nats"]["spec"]
    routes = docs["ConfigMap/nats-config"]["data"]["nats.conf"]
    assert servers["replicas"] == 3 and servers["serviceName"] == "nats-cluster"
    assert all(f"nats://nats-{i}.nats-cluster:6222" in routes for i in range(3)) and "sync_interval: always" in routes
    config = documents(ROOT / "deploy" / "k8s" / "config.yaml")[0]["data"]
    assert config["CLAIMBROKER_STREAM_REPLICAS"] == str(servers["replicas"])


def test_no_secret_value_is_committed() -> None:
    """Secrets are generated where the broker runs (deploy/k8s/create-secrets.sh), never kept here."""
    for path in (ROOT / "deploy").rglob("*.yaml"):
        for doc in documents(path):
            assert doc.get("kind") != "Secret" or not (doc.get("data") or doc.get("stringData")), path
    script = (ROOT / "deploy" / "k8s" / "create-secrets.sh").read_text()
    assert "create secret generic claim-broker-db" in script and "/dev/urandom" in script


def test_network_policies_let_only_the_broker_reach_the_ledger() -> None:
    policies = {d["metadata"]["name"]: d["spec"] for d in documents(ROOT / "deploy" / "k8s" / "network-policies.yaml")}
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    postgres = policies["postgres-from-the-broker"]
    assert postgres["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "postgres"}}
    broker = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "claim-broker"}}}
    bus_auth_sidecars = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "nats"}}}
    assert postgres["ingress"] == [{"from": [broker, bus_auth_sidecars], "ports": [{"port": 5432, "protocol": "TCP"}]}]
    every_pod = [d for path in (ROOT / "deploy" / "k8s").glob("*.yaml") for d in documents(path)
                 if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    ledger_clients = [d["metadata"]["name"] for d in every_pod
                      if any(e.get("name") == "PGPASSWORD" for c in containers(d) for e in c.get("env", []))]
    assert sorted(ledger_clients) == ["admin-api", "allocator", "estimator", "migrate", "nats", "notifier", "watcher"]
    for name in ledger_clients:  # every pod that holds the ledger password carries a label the policy admits
        pod = next(d for d in every_pod if d["metadata"]["name"] == name)
        labels = pod["spec"]["template"]["metadata"]["labels"]
        assert labels.get("app.kubernetes.io/name") in ("claim-broker", "nats"), name
    nats = policies["nats-clients-and-routes"]["ingress"]
    assert {p["port"] for rule in nats for p in rule["ports"]} == {4222, 6222, 8222}


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_every_client_of_the_bus_has_its_own_identity() -> None:
    """The NATS servers include the users file their bus-auth sidecar renders from the ledger; each
    service's URL carries its own user, its password from the generated Secret."""
    k8s = ROOT / "deploy" / "k8s"
    config = next(d for d in documents(k8s / "nats.yaml") if d["kind"] == "ConfigMap")["data"]["nats.conf"]
    assert "include ../nats-auth/auth.conf" in config and "pid_file: /var/run/nats/nats.pid" in config
    server = next(d for d in documents(k8s / "nats.yaml") if d["kind"] == "StatefulSet")
    sidecar = server["spec"]["template"]["spec"]["initContainers"][0]
    assert server["spec"]["template"]["spec"]["shareProcessNamespace"] is True
    assert sidecar["args"] == ["serve", "bus-auth"] and sidecar["restartPolicy"] == "Always"
    assert {e["name"] for e in sidecar["env"]} >= {"CLAIMBROKER_BUS_PASSWORDS", "CLAIMBROKER_BUS_AUTH_FILE",
                                                    "CLAIMBROKER_NATS_PID_FILE"}
    # tenant accounts' status streams are made through the sidecar's own server, as the bus admin
    assert {e["name"]: e.get("value") for e in sidecar["env"]}["CLAIMBROKER_NATS_URL"] == "nats://127.0.0.1:4222"
    script = (k8s / "create-secrets.sh").read_text()
    assert "claim-broker-bus" in script and "passwords.json" in script
    for service in bus_auth.SERVICES:  # every service has its own user, the admin API too (it reads the bus)
        workload = next(d for d in documents(k8s / f"{service}.yaml") if d["kind"] == "Deployment")
        env = {e["name"]: e for e in containers(workload)[0]["env"]}
        assert env["BUS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "claim-broker-bus", "key": service}
        assert env["CLAIMBROKER_NATS_URL"]["value"] == f"nats://service.{service}:$(BUS_PASSWORD)@nats:4222"
        assert f"--from-literal={service}=" in script and f'\\"{service}\\":' in script
