"""What every command shares: the Typer app, the global options (kept in Typer's context), output formats,
the errors that end a command with one line, logging and the ledger for commands that work before the API runs.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shared.settings import BrokerSettings

T = TypeVar("T")


app = typer.Typer(help="claim-broker: an event-driven GPU claim broker with DRA-exact allocation.",
                  no_args_is_help=True, add_completion=False)


console = Console(width=None if sys.stdout.isatty() else 160)


err = Console(stderr=True, soft_wrap=True, highlight=False)


log = logging.getLogger("claimbroker")


@dataclass(frozen=True)
class Globals:
    """The global options of this invocation."""

    nats: str | None = None
    api: str | None = None
    token: str | None = None
    data_dir: Path | None = None


# Set by the app's callback for this invocation: a context variable, not a mutable module global, because
# Typer hands its context only to the command, and the helpers that need the options are many levels down.
_OPTIONS: ContextVar[Globals | None] = ContextVar("claimbroker_cli_options", default=None)


def options() -> Globals:
    """This invocation's global options (the defaults outside a command, as in a test calling a helper)."""
    return _OPTIONS.get() or Globals()


def _print_version(asked: bool | None) -> None:
    if asked:
        from importlib.metadata import version

        print(f"claimbroker {version('claim-broker')}")
        raise typer.Exit()


@app.callback(invoke_without_command=False)
def _global(
    context: typer.Context,
    nats: Annotated[str | None, typer.Option(envvar="CLAIMBROKER_NATS", help="NATS URL")] = None,
    api: Annotated[str | None, typer.Option(envvar="CLAIMBROKER_API", help="admin API URL")] = None,
    token: Annotated[str | None, typer.Option(envvar="CLAIMBROKER_TOKEN", help="API bearer token")] = None,
    data_dir: Annotated[Path | None, typer.Option(envvar="CLAIMBROKER_DATA_DIR", help="data folder")] = None,
    version: Annotated[bool | None, typer.Option("--version", callback=_print_version, is_eager=True,
                                                 help="print the version and exit")] = None,
) -> None:
    context.obj = Globals(nats, api, token, data_dir)
    _OPTIONS.set(context.obj)


def cli_settings(**overrides: Any) -> BrokerSettings:
    """Options over CLAIMBROKER_* variables, validated (so "5m" becomes 300 seconds)."""
    values = {k: v for k, v in overrides.items() if v is not None}
    if options().data_dir is not None:
        values.setdefault("data_dir", options().data_dir)
    if options().nats:
        values.setdefault("nats_url", options().nats)
    from pydantic import ValidationError

    try:
        return BrokerSettings(**values)
    except ValidationError as error:  # a value given as an option or a variable: a usage error, one line
        problems = "; ".join(f"{_setting_name(e['loc'])}: {e['msg']}" for e in error.errors()[:3])
        say_error(f"claimbroker: invalid setting: {problems}")
        raise typer.Exit(2) from None


def _setting_name(location: tuple[Any, ...]) -> str:
    """A setting as the user gives it: --option (or CLAIMBROKER_OPTION)."""
    field = str(location[0]) if location else "?"
    return f"--{field.replace('_', '-')} (CLAIMBROKER_{field.upper()})"


def _output_format(value: str) -> str:
    if value not in ("table", "json", "yaml"):
        raise typer.BadParameter(f"must be table, json or yaml, not {value!r}")
    return value


Output = Annotated[str, typer.Option("--output", "-o", help="table | json | yaml", callback=_output_format)]


def _output_format_or_none(value: str | None) -> str | None:
    return None if value is None else _output_format(value)


# For a command whose plain output is neither a table nor a document (`submit`'s lines): its own without -o
MaybeOutput = Annotated[str | None, typer.Option("--output", "-o", help="table | json | yaml",
                                                 callback=_output_format_or_none)]

def emit_document(data: Any, output: str) -> bool:
    """Print `data` as JSON or YAML when asked (True); False: the caller prints its table."""
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False), end="")
    return output != "table"


class Refused(Exception):
    """A server refused who we are (a revoked or wrong credential): one line, exit 1, like a 4xx."""


class Unreachable(Exception):
    """A server the command needs cannot be reached or does not hold the broker: one line, exit 3."""


class Interrupted(Exception):
    """Ctrl-C stopped a command that has something to say about how far it got: one line, exit 130."""


def say_error(line: str) -> None:
    """One line on stderr, credentials masked, printed as it is (no console markup: `[0]` or `[a]` in a
    path or an expression stays)."""
    from services.runtime.logs import mask_secrets

    err.print(mask_secrets(line), markup=False, highlight=False)


def configure_cli_logging(verbose: bool, log_format: str = "text") -> None:
    from services.runtime.logs import configure

    configure(verbose, log_format)


LogFormat = Annotated[str | None, typer.Option(
    "--log-format", help="text, or json: one object a line and a line per decision batch")]


async def with_ledger(db: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(session_factory)` on the ledger of --db or the data folder, which must exist and be current."""
    from shared.ledger.engine import LedgerNotReady, create_engine, require_current, sessions

    settings = cli_settings(db=db)
    try:
        await require_current(settings.database_url())
    except LedgerNotReady as error:
        raise Unreachable(str(error)) from None
    engine = create_engine(settings.database_url())
    try:
        return await work(sessions(engine))
    finally:
        await engine.dispose()


def make_table(columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:  # as text, never console markup: a reason or a name may hold "[...]"
        table.add_row(*(Text("" if v is None else str(v)) for v in row))
    return table


def print_done(line: str, data: dict[str, Any], output: str | None) -> None:
    """What a command that did one thing prints: its line, or with -o the same as a document (a table of
    one row)."""
    if output is None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    elif not emit_document(data, output):
        console.print(make_table([k.upper() for k in data], [list(data.values())]))


def print_listing(data: Any, output: str, columns: list[str], rows: list[list[Any]]) -> None:
    if not emit_document(data, output):
        console.print(make_table(columns, rows))
