#!/usr/bin/env bash
# The tests create their own database per run on the local PostgreSQL (127.0.0.1:5432, user postgres).
# Start the machine's cluster if it is installed but down; on a Debian-like machine without one, install it
# (as `make test` installs Chromium) and let local connections in without a password, as the tests expect.
# Never skip PostgreSQL tests in CI: a PostgreSQL still unreachable fails them.
set -euo pipefail
if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then exit 0; fi
if ! [ -d /etc/postgresql ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "PostgreSQL is not installed: installing the distribution's postgresql package (apt-get)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  version=$(ls /etc/postgresql | sort -n | tail -1)
  hba="/etc/postgresql/$version/main/pg_hba.conf"
  { echo "host all all 127.0.0.1/32 trust  # claim-broker's tests"; cat "$hba"; } > "$hba.new" && mv "$hba.new" "$hba"
  echo "PostgreSQL $version installed; connections from 127.0.0.1 are trusted (a test machine's setup)" >&2
fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  version=$(ls /etc/postgresql | sort -n | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 0.2; done
fi
echo "PostgreSQL is not reachable on 127.0.0.1:5432; the PostgreSQL tests will fail" >&2
exit 0
