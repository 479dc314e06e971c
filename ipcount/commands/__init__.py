"""One module per `ipcount` subcommand; each defines `register(subparsers)` and an ORDER for
--help."""

import argparse
from typing import TypeAlias

__all__ = ["SubParsers", "add_action_parser"]

# What `register` receives: the root parser's add_subparsers() (argparse keeps its class private).
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_action_parser(
    sub: SubParsers, name: str, actions: list[str], help: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand whose first argument is one of `actions` (`ipcount broker start`)."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("action", choices=actions)
    return p
