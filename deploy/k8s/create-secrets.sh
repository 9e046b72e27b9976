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
