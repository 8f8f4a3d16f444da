#!/usr/bin/env bash
# Installs everything the tests need (PostgreSQL included) and runs the whole suite.
# Usage: bash scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/ensure-postgres.sh
# The console's browser tests (tests/console) drive the distribution's Chromium, found on PATH
# as tests/console/conftest.py finds it; here a missing browser fails them instead of skipping them.
if ! command -v chromium >/dev/null 2>&1; then
    echo "Chromium is not installed: installing it"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
fi
export EFFECT_LEDGER_REQUIRE_BROWSER=1
# The browser tests' screenshot of each console page, kept after the run (git-ignored).
if [ -z "${EFFECT_LEDGER_SCREENSHOTS:-}" ]; then
    export EFFECT_LEDGER_SCREENSHOTS="$PWD/.artifacts/screenshots"
    rm -rf "$EFFECT_LEDGER_SCREENSHOTS"
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
# The client distribution (clients/python) with its framework adapters and its operator command
# line, tested in tests/client against the real server and the real frameworks.
.venv/bin/python -m pip install --quiet -e "./clients/python[langgraph,openai-agents,mcp,cli,console]"
# OPA's own Go engine, to run the policy's tests as a real OPA server would. The wheel is a
# ctypes wrapper around a shared library (py3-none); its metadata asks for Python >= 3.14,
# which this project's Python does not meet, so the check is skipped for this one package.
.venv/bin/python -m pip install --quiet --no-deps --ignore-requires-python "opa-golib-python-bindings==0.4.4"

# The linter and the type checker the project configures (pyproject.toml), pinned in [test].
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy server/effect_ledger clients/python/effect_ledger_client

.venv/bin/effect-ledger policy-test
.venv/bin/effect-ledger policy-test --engine opa
# Two pytest processes (pytest-xdist), each running whole test files (--dist loadfile: a
# module's fixtures, such as its servers, are set up once): most tests wait on servers and
# subprocesses, so two cores run the suite in about two thirds of the time. Each process has
# its own databases and servers. Pass `-p no:xdist` (or `-n 0`) to run in one process.
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
