"""The `claimbroker` command line (see the contract): run the broker, talk to it, simulate offline. One module
per command group; importing them registers their commands on the app."""

from services.cli import admin, broker, claims, credentials, tokens, whatif  # noqa: F401  (registers the commands)
from services.cli.bus import read_statuses
from services.cli.common import app
from services.cli.main import globals_first, main

__all__ = ["app", "globals_first", "main", "read_statuses"]
