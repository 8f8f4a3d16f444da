"""``effect-ledger-ctl``: the operator's command line, over gRPC (never the database).

    pip install 'effect-ledger-client[cli]'
    effect-ledger-ctl effects list --stage UNKNOWN

See docs/cli.md. It needs the ``cli`` extra (typer, rich, pyyaml); the client itself does not.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_MISSING_EXTRA = 1


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: the process's); returns the exit code."""
    try:
        from effect_ledger_client.cli._app import run
    except ImportError as error:
        sys.stderr.write(
            f"error: effect-ledger-ctl needs the cli extra ({error.name} is missing): "
            "pip install 'effect-ledger-client[cli]'\n"
        )
        return EXIT_MISSING_EXTRA
    return run(argv)


__all__ = ["main"]
