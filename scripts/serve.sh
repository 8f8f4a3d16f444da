#!/usr/bin/env bash
# Installs the service into ./.venv and starts it with its embedded defaults:
# 127.0.0.1:50051, a SQLite file under ./.effect-ledger/, the packaged Rego policy.
# Usage: bash scripts/serve.sh [effect-ledger serve flags]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/effect-ledger serve "$@"
