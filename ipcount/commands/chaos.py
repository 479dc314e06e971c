"""`ipcount chaos`: prove exactly-once under faults. SIGKILL the job (at random and inside/after
the sink's transaction) and restart the broker while data flows, then verify the output."""

from __future__ import annotations

import argparse

from ipcount.commands import SubParsers, add_local_run_options, add_options_command, options_from
from ipcount.config import Settings

__all__ = ["register", "run"]


_HELP = "crash-and-restart proof: kill -9 the job, restart the broker, verify exactly-once"

_DESCRIPTION = """\
Start a local broker (or use the configured one), fresh topics, `loadgen synth` and the Spark job
(its own process group). While data flows, SIGKILL the whole job at random moments and at the
sink's fault points (IPCOUNT_FAULTS: inside the open transaction, and between the Kafka commit and
Spark's commit log), restart the broker, and restart the job from its checkpoint after each crash.
Then verify the sink against the generator's ledger: read_committed must be exact; read_uncommitted
shows the duplicates that the aborted transactions hold. One line per fault; the last line is the
verify summary. Exit 0 only if the output is exact and every planned fault was injected."""


def register(sub: SubParsers) -> None:
    p, add = add_options_command(sub, "chaos", run, _HELP, _DESCRIPTION)
    add("--records", "records", int, "records to generate (default 20000)")
    add(
        "--rate",
        "rate",
        float,
        "records per second (default: --records spread over the time the faults take, "
        "about 40 s each; more records follow if the faults take longer)",
    )
    add(
        "--kills",
        "kills",
        int,
        "job SIGKILLs: random, at sink.before_commit and at sink.after_commit (from 3 on, "
        "at least one of each; default 3)",
    )
    add(
        "--broker-restarts",
        "broker_restarts",
        int,
        "broker restarts (default 1): SIGTERM on noida-db; on Apache Kafka SIGKILL and "
        "SIGTERM in turn",
    )
    add(
        "--broker-hangs",
        "broker_hangs",
        int,
        "hung brokers: SIGSTOP for --broker-hang seconds, then SIGCONT (default 0)",
    )
    add("--broker-hang", "broker_hang_seconds", float, "seconds a hung broker stays stopped")
    add(
        "--broker-nodes",
        "broker_nodes",
        int,
        "1 (default): one broker; 3 to 5: a local Apache Kafka cluster (three replicas, two in "
        "sync) and cluster faults in place of broker restarts and hangs",
    )
    add(
        "--cluster-faults",
        "cluster_faults",
        int,
        "with --broker-nodes 3: cluster faults (default 6, each kind once): SIGKILL of the sink's "
        "leader, of the transaction coordinator, of the active controller; a leader hung past "
        "the session timeout; a rolling restart; two nodes down at once; each at a random "
        "moment, in a commit, or between the Kafka commit and Spark's commit log",
    )
    add("--node-downtime", "node_downtime_seconds", float, "seconds a killed node stays down")
    add(
        "--standalone-workers",
        "standalone_workers",
        int,
        "0 (default): the job in Spark's local mode; N: on a local Spark standalone cluster of N "
        "one-core workers. --kills then also SIGKILLs executors (from 4 kills, one of each kind: "
        "driver, executor, and the two fault points, which kill the executor running the sink "
        "task; Spark retries the task on another executor without restarting the query)",
    )
    add("--seed", "seed", int, "seed of fault plan and data (default: random)")
    add("--ips", "ips", int, "distinct client IPs (default 200)")
    add("--late-fraction", "late_fraction", float, "late records (default 0.002)")
    add("--malformed-fraction", "malformed_fraction", float, "malformed (default 0.002)")
    # --use-configured-broker defaults to ChaosOptions' own default (False).
    add_local_run_options(
        p, "chaos", "run", "logs, ledgers, checkpoint, broker data",
        broker_note="; it is restarted only if it is the local [broker] of `ipcount broker start`",
    )  # fmt: skip
    add("--idle-timeout", "idle_timeout_seconds", float, "job.idle_timeout_seconds (default 3)")
    add("--trigger-interval", "trigger_interval_seconds", float, "job.trigger_interval_seconds")
    add("--broker-downtime", "broker_downtime_seconds", float, "seconds the broker stays down")
    add(
        "--start-timeout",
        "start_timeout_seconds",
        float,
        "seconds a (re)started job may take to commit a batch (default 240)",
    )


def _say(text: str) -> None:
    print(f"[chaos] {text}", flush=True)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.chaos.plan import ChaosOptions
    from ipcount.chaos.runner import run_chaos

    options = options_from(args, ChaosOptions)
    report = run_chaos(
        settings, options, on_event=lambda ev: _say(f"fault {ev.line()}"), on_note=_say
    )
    committed, uncommitted = report.committed, report.uncommitted
    if committed is not None and not committed.exact:
        for line in committed.examples:
            _say(f"  {line}")
    if uncommitted is not None:
        _say(
            f"a read_uncommitted consumer sees {uncommitted.duplicates} duplicates (records of "
            f"aborted transactions): {uncommitted.summary()}"
        )
    for line in report.cluster_lines():
        _say(f"cluster fault {line}")
    _say(report.summary())
    if report.broker_loss:
        _say(report.broker_loss)
    if report.missed:
        _say(f"{report.missed} planned fault(s) could not be injected: the proof is incomplete")
    _say(f"logs, ledgers and checkpoint: {report.run_dir}")
    if options.use_configured_broker:
        _say(f"re-check any time: {report.verify_command}")
    if committed is not None or report.broker_loss:
        print(report.final_line(), flush=True)
    return 0 if report.ok else 1
