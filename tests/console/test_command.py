"""``effect-ledger-console`` where the ``console`` extra is not installed: one line that says what
to install, and the exit code, as ``effect-ledger-ctl`` does without its extra.

The command runs in a Python whose path holds this environment's packages except the extra's:
``python -S`` (no site-packages) with ``PYTHONPATH`` set to a folder of links to every
site-packages entry but those of the extra's distributions, and to the client's sources."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import effect_ledger_client
from effect_ledger_client.console import serve

# The [console] extra of clients/python/pyproject.toml.
EXTRA_DISTRIBUTIONS = ("starlette", "jinja2", "uvicorn", "python-multipart", "sse-starlette")
COMMAND_TIMEOUT_SECONDS = 60.0


def _top_level_names(distribution: str) -> set[str]:
    """The site-packages entries a distribution installed (packages, modules, its .dist-info)."""
    files = metadata.distribution(distribution).files or []
    return {Path(str(file)).parts[0] for file in files if not str(file).startswith("..")}


def _site_packages_without_the_extra(folder: Path) -> set[str]:
    hidden = set().union(*(_top_level_names(name) for name in EXTRA_DISTRIBUTIONS))
    site_packages = Path(sysconfig.get_paths()["purelib"])
    for entry in site_packages.iterdir():
        if entry.name not in hidden:
            (folder / entry.name).symlink_to(entry)
    return {name.split(".")[0] for name in hidden if not name.endswith(".dist-info")}


def test_without_the_extra_the_console_says_what_to_install(tmp_path):
    packages = tmp_path / "site-packages"
    packages.mkdir()
    hidden_modules = _site_packages_without_the_extra(packages)
    assert {"starlette", "uvicorn", "jinja2"} <= hidden_modules
    client_sources = Path(effect_ledger_client.__file__).resolve().parents[1]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(packages), str(client_sources)])}

    result = subprocess.run(
        [sys.executable, "-S", "-m", "effect_ledger_client.console", "--server", "127.0.0.1:1"],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
    )

    assert result.returncode == serve.EXIT_MISSING_EXTRA == 1, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: effect-ledger-console needs the console extra ("), line
    assert line.endswith(" is missing): pip install 'effect-ledger-client[console]'"), line
    missing = line.split("(", 1)[1].split(" ", 1)[0]
    assert missing in hidden_modules, line
    assert result.stdout == ""
