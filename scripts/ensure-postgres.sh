#!/usr/bin/env bash
# The tests create their own database per run on the local PostgreSQL (127.0.0.1:5432).
# Start the machine's cluster if it is installed but down; never skip PostgreSQL tests in CI.
set -euo pipefail
if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then exit 0; fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  version=$(ls /etc/postgresql | sort -n | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 0.2; done
fi
echo "PostgreSQL is not reachable on 127.0.0.1:5432; the PostgreSQL tests will fail" >&2
exit 0
