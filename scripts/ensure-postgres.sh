#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 for the tests (user root, trust auth):
# installs it from the distribution's packages when missing, starts it when stopped.
set -euo pipefail

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }

if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "PostgreSQL is not installed: installing it"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    fresh_install=1
else
    fresh_install=0
fi

version=$(ls /etc/postgresql | sort -V | tail -n 1)
if ! pg_ready; then
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
fi
for _ in $(seq 1 60); do
    pg_ready && break
    sleep 0.5
done
pg_ready || { echo "PostgreSQL did not start" >&2; exit 1; }

if [ "$fresh_install" = 1 ] || ! psql -h 127.0.0.1 -U root -d postgres -Atc 'select 1' >/dev/null 2>&1; then
    # A fresh cluster knows no role "root" and asks for passwords on TCP: give the test user
    # trust on the loopback address only.
    hba="/etc/postgresql/$version/main/pg_hba.conf"
    if ! grep -q "effect-ledger tests" "$hba"; then
        sed -i "1i host all root 127.0.0.1/32 trust # effect-ledger tests" "$hba"
    fi
    su postgres -c "psql -qAtc \"SELECT 1 FROM pg_roles WHERE rolname='root'\"" | grep -q 1 \
        || su postgres -c "psql -qc 'CREATE ROLE root SUPERUSER LOGIN'"
    su postgres -c "psql -qAtc \"SELECT 1 FROM pg_database WHERE datname='root'\"" | grep -q 1 \
        || su postgres -c "createdb -O root root"
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload
fi
psql -h 127.0.0.1 -U root -d postgres -Atc 'select 1' >/dev/null
