"""One module per `ipcount` subcommand; each defines `register(subparsers)` and an ORDER for
--help."""

__all__: list[str] = []
