"""The entry point: global options accepted anywhere, one line per error, the contract's exit statuses.
"""

from __future__ import annotations

import sys

try:  # Typer 0.27 carries its own click; older ones use click's
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover
    from click import exceptions as click  # type: ignore[no-redef]

from services.cli.common import Interrupted, Refused, Unreachable, app, say_error
from shared.dra import model as dra

GLOBAL_OPTIONS = ("--nats", "--api", "--token", "--data-dir")
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


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


def usage_line(error: click.UsageError) -> str:
    """A usage error as one line: the command, what is wrong, where help is (Typer's own is a framed box
    of several lines)."""
    where = error.ctx.command_path if error.ctx is not None else "claimbroker"
    return f"{where}: {' '.join(error.format_message().split())} (see `{where} --help`)"


def main() -> None:
    """Errors are one line on stderr, credentials masked, never a traceback (CLAIMBROKER_DEBUG=1 shows it).
    Exit statuses: 0 done, 1 refused, 2 usage, 3 unreachable or failed, 130 interrupted."""
    import os

    from services.runtime.logs import configure_command_line

    configure_command_line()
    try:
        code = app(args=globals_first(sys.argv[1:]), prog_name="claimbroker", standalone_mode=False)
    except click.NoArgsIsHelpError:
        sys.exit(2)  # the help is printed already
    except click.UsageError as error:
        say_error(usage_line(error))
        sys.exit(2)
    except click.ClickException as error:
        say_error(f"claimbroker: {error.format_message()}")
        sys.exit(error.exit_code)
    except click.Abort:
        say_error("claimbroker: aborted")
        sys.exit(1)
    except dra.DocumentError as error:
        say_error(str(error))
        sys.exit(1)
    except Unreachable as error:
        say_error(f"claimbroker: {error}")
        sys.exit(3)
    except Refused as error:
        say_error(f"claimbroker: {error}")
        sys.exit(1)
    except Interrupted as error:
        say_error(f"claimbroker: {error}")
        sys.exit(INTERRUPTED)
    except Exception as error:  # the command line's last resort: one line instead of a traceback
        if os.environ.get("CLAIMBROKER_DEBUG"):
            raise
        say_error(f"claimbroker: {type(error).__name__}: {error} (CLAIMBROKER_DEBUG=1 shows where)")
        sys.exit(3)
    if code == INTERRUPTED:  # Ctrl-C (Typer turns it into this status) of a command that has nothing to add
        say_error("claimbroker: interrupted")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
