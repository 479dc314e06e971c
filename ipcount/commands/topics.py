"""`ipcount topics create|list`: provision the configured topics."""

from __future__ import annotations

import argparse

from ipcount.commands import SubParsers, add_action_parser
from ipcount.config import Settings
from ipcount.kafka.topics import ensure_topics, missing_topics, topic_specs

__all__ = ["register"]


def register(sub: SubParsers) -> None:
    p = add_action_parser(
        sub,
        "topics",
        ["create", "list"],
        help="create or list the pipeline's topics",
        description="Create the configured topics (idempotent) or show which exist.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "create":
        for name, state in ensure_topics(settings).items():
            print(f"{name}: {state}")
        return 0
    missing = set(missing_topics(settings))
    for spec in topic_specs(settings):
        state = "missing" if spec.name in missing else "exists"
        print(f"{spec.role:12} {spec.name}: {state} (partitions {spec.partitions})")
    return 1 if missing else 0
