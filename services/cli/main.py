"""The entry point: global options accepted anywhere, one line per error, the contract's exit statuses.
"""

from __future__ import annotations

import sys

from services.cli.common import Refused, Unreachable, app, err
from shared.dra import model as dra

GLOBAL_OPTIONS = ("--nats", "--api", "--token", "--data-dir")


def globals_first(argv: list[str]) -> list[str]:
    """kubectl's habit: the global options are accepted after the command too (`status --data-dir X`); they
    are moved before it, with their values. What follows `--` is left as it is."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg.split("=", 1)[0] in GLOBAL_OPTIONS:
            taken = 1 if "=" in arg else 2
            front.extend(argv[i:i + taken])
            i += taken
            continue
        rest.append(arg)
        i += 1
    return front + rest


def main() -> None:
    """Errors are one line on stderr, never a traceback (CLAIMBROKER_DEBUG=1 shows it)."""
    import os

    try:
        app(args=globals_first(sys.argv[1:]))
    except dra.DocumentError as error:
        err.print(str(error))
        sys.exit(1)
    except Unreachable as error:
        err.print(f"claimbroker: {error}")
        sys.exit(3)
    except Refused as error:
        err.print(f"claimbroker: {error}")
        sys.exit(1)
    except Exception as error:
        if os.environ.get("CLAIMBROKER_DEBUG"):
            raise
        err.print(f"claimbroker: {type(error).__name__}: {error} (CLAIMBROKER_DEBUG=1 shows where)")
        sys.exit(3)


if __name__ == "__main__":
    main()
