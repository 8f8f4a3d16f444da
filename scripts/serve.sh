#!/usr/bin/env bash
# Installs the service into ./.venv and starts it with its embedded defaults:
# 127.0.0.1:50051, a SQLite file under ./.effect-ledger/, the packaged Rego policy, one server
# process (--workers 1; pass --workers N, or set EFFECT_LEDGER_WORKERS, for more: each worker
# is a process of its own and adds to the start).
# The install is skipped when .venv already holds it installed from this pyproject.toml and
# setup.py (the stamp .venv/.effect-ledger-installed keeps their hash); edit either, or delete
# the stamp, to install again.
# Usage: bash scripts/serve.sh [effect-ledger serve flags]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.effect-ledger-installed
wanted="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/effect-ledger ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e .
    echo "$wanted" > "$stamp"
fi
workers=(--workers 1)
if [ -n "${EFFECT_LEDGER_WORKERS:-}" ]; then
    workers=()
fi
for argument in "$@"; do
    case "$argument" in
        --workers | --workers=*) workers=() ;;
    esac
done
exec .venv/bin/effect-ledger serve "${workers[@]}" "$@"
