"""One module per `ipcount` subcommand; each defines `register(subparsers)`. HELP_ORDER is their
order in `ipcount --help`."""

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeAlias, TypeVar

__all__ = [
    "HELP_ORDER",
    "SubParsers",
    "add_action_parser",
    "add_local_run_options",
    "add_no_late_option",
    "add_options_command",
    "options_flags",
    "options_from",
]

# `ipcount --help` lists the subcommands in this order: first tries, the job, reading its output,
# then operations and proofs (`bench` is ipcount.bench.subcommands). One not named here goes last.
HELP_ORDER = (
    "demo",
    "run",
    "consume",
    "top",
    "dashboard",
    "verify",
    "topics",
    "chaos",
    "soak",
    "bench",
    "broker",
)

# What `register` receives: the root parser's add_subparsers() (argparse keeps its class private).
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


# Any dataclass (what dataclasses.fields takes; typeshed's DataclassInstance, not a package).
class _Dataclass(Protocol):
    __dataclass_fields__: ClassVar[dict[str, Any]]


_Options = TypeVar("_Options", bound=_Dataclass)


def add_action_parser(
    sub: SubParsers, name: str, actions: list[str], help: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand whose first argument is one of `actions` (`ipcount broker start`)."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("action", choices=actions)
    return p


def add_no_late_option(p: argparse.ArgumentParser) -> None:
    """--no-late of the commands that read the job's results (`top`, `dashboard`): final counts
    only, topics.late not read."""
    p.add_argument(
        "--no-late",
        action="store_true",
        help="ignore topics.late: final counts only (for a job with job.late_corrections off)",
    )


def add_local_run_options(
    p: argparse.ArgumentParser, command: str, run_dir: str, holds: str, broker_note: str = ""
) -> None:
    """Where a long local run (`ipcount chaos`, `ipcount soak`) keeps its files, and whether it
    starts its own broker: --work-dir (default .ipcount/COMMAND) and --use-configured-broker."""
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path(f".ipcount/{command}"),
        help=f"each run goes to WORK_DIR/{run_dir}-<id>: {holds}",
    )
    p.add_argument(
        "--use-configured-broker",
        action="store_true",
        help="use kafka.bootstrap_servers instead of starting a broker" + broker_note,
    )


# `add(flag, field, kind, text)` of options_flags.
AddFlag: TypeAlias = Callable[[str, str, type[Any], str], None]


def add_options_command(
    sub: SubParsers, name: str, run: Callable[..., int], help: str, description: str
) -> tuple[argparse.ArgumentParser, AddFlag]:
    """The subcommand `name`, which runs `run` with an options dataclass its flags fill
    (`ipcount chaos`, `ipcount soak`): its parser, and the parser's options_flags to add them."""
    p = sub.add_parser(name, help=help, description=description)
    p.set_defaults(func=run)
    return p, options_flags(p)


def options_flags(p: argparse.ArgumentParser) -> AddFlag:
    """`add(flag, field, kind, text)`: a flag of `p` that sets the field `field` of the command's
    options dataclass (`ipcount chaos`, `ipcount soak`); left out, the field's default holds (see
    options_from), so the dataclass alone says what the defaults are."""

    def add(flag: str, field: str, kind: type[Any], text: str) -> None:
        metavar = flag.removeprefix("--").upper().replace("-", "_")
        p.add_argument(
            flag, dest=field, metavar=metavar, type=kind, default=argparse.SUPPRESS, help=text
        )

    return add


def options_from(args: argparse.Namespace, kind: type[_Options], **more: Any) -> _Options:
    """The options dataclass `kind` with every field a flag gave (options_flags, and the local run
    options) and `more`; the other fields keep their defaults."""
    fields = dataclasses.fields(kind)
    given = {f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)}
    return kind(**given, **more)
