#!/usr/bin/env bash
# Installs everything the tests need (PostgreSQL included) and runs the whole suite.
# Usage: bash scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/ensure-postgres.sh

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"

.venv/bin/effect-ledger policy-test
exec .venv/bin/python -m pytest "$@"
