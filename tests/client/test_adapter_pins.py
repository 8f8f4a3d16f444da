"""The adapters' tests run against the framework versions the extras pin: a drift between what is
installed and clients/python/pyproject.toml fails here, not silently in a user's environment."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version

from support import REPO

PYPROJECT = REPO / "clients" / "python" / "pyproject.toml"
ADAPTER_EXTRAS = ("langgraph", "openai-agents", "mcp")
PINNED_FRAMEWORKS = {
    "langgraph",
    "langgraph-prebuilt",
    "langgraph-checkpoint",
    "langchain-core",
    "openai-agents",
    "mcp",
}


def pins() -> dict[str, str]:
    """distribution -> pinned version, over the adapters' extras."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    pinned: dict[str, str] = {}
    for extra in ADAPTER_EXTRAS:
        for requirement in extras[extra]:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)", requirement)
            assert match, f"[{extra}] {requirement!r} is not pinned with =="
            pinned[match.group(1).lower()] = match.group(2)
    return pinned


def test_each_adapter_extra_pins_its_frameworks():
    assert set(pins()) == PINNED_FRAMEWORKS


def test_the_installed_frameworks_are_the_pinned_versions():
    installed = {name: version(name) for name in pins()}
    assert installed == pins()
