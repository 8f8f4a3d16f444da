#!/usr/bin/env bash
# Installs the service into ./.venv and starts it with its embedded defaults:
# 127.0.0.1:50051, a SQLite file under ./.effect-ledger/, the packaged Rego policy.
# The install is skipped when .venv already holds it installed from this pyproject.toml
# (the stamp .venv/.effect-ledger-installed keeps that file's hash); edit pyproject.toml, or
# delete the stamp, to install again.
# Usage: bash scripts/serve.sh [effect-ledger serve flags]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.effect-ledger-installed
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x .venv/bin/effect-ledger ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e .
    echo "$wanted" > "$stamp"
fi
exec .venv/bin/effect-ledger serve "$@"
