"""One module per `ipcount` subcommand; each defines `register(subparsers)` and an ORDER for
--help."""

import argparse
from typing import TypeAlias

__all__ = ["SubParsers"]

# What `register` receives: the root parser's add_subparsers() (argparse keeps its class private).
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
