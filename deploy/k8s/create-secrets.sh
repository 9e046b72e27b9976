#!/bin/sh
# The broker's secrets, generated here and never committed: run once before `kubectl apply -k deploy/k8s`.
# An existing secret is kept (rotating the ledger password is a PostgreSQL change first). With a secret
# manager (External Secrets, Sealed Secrets, ...) create the same Secret there instead.
set -eu
namespace="${NAMESPACE:-claim-broker}"
kubectl get namespace "$namespace" >/dev/null 2>&1 || kubectl create namespace "$namespace"
if kubectl -n "$namespace" get secret claim-broker-db >/dev/null 2>&1; then
  echo "secret claim-broker-db exists in $namespace: kept"
else
  kubectl -n "$namespace" create secret generic claim-broker-db \
    --from-literal=password="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
  echo "secret claim-broker-db created in $namespace (key: password)"
fi
# The bus: a password for each service's own NATS user and for the bus admin, and the same as one JSON
# document for the bus-auth sidecar beside each NATS server (deploy/k8s/nats.yaml), which renders them,
# hashed, with the tenants' credentials from the ledger. Hex: it goes into a nats:// URL as it is.
if kubectl -n "$namespace" get secret claim-broker-bus >/dev/null 2>&1; then
  echo "secret claim-broker-bus exists in $namespace: kept"
else
  new() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }
  allocator="$(new)"; notifier="$(new)"; watcher="$(new)"; api="$(new)"; admin="$(new)"
  kubectl -n "$namespace" create secret generic claim-broker-bus \
    --from-literal=allocator="$allocator" --from-literal=notifier="$notifier" \
    --from-literal=watcher="$watcher" --from-literal=admin-api="$api" --from-literal=admin="$admin" \
    --from-literal=passwords.json="{\"allocator\":\"$allocator\",\"notifier\":\"$notifier\",\"watcher\":\"$watcher\",\"admin-api\":\"$api\",\"admin\":\"$admin\"}"
  echo "secret claim-broker-bus created in $namespace (keys: allocator, notifier, watcher, admin-api, admin, passwords.json)"
fi
