#!/usr/bin/env python3
"""Engine-neutral driver: start a stream job, time it, verify its output.

  time_job.py --workdir W --name quix [--group G] [--tail live|preload] -- <job command...>

W must hold meta.json + truth.csv from `load_input.py load`.  The driver
  1. (tail=preload) appends the tail records before the job starts;
  2. starts a read_committed watcher on the output topic, then the job (t0);
  3. (tail=live) appends the tail once the job's consumer group has committed
     the end offsets of the main data on every input partition (needs --group);
  4. stops the clock when every expected (window, ip) result has been read
     (read_committed, so = committed), reads on for --linger s to catch
     duplicates, sends SIGTERM to the job;
  5. re-reads the whole output topic with a fresh read_committed consumer and
     compares it with truth.csv: exact = no missing, no wrong count, no
     duplicate, no extra result.
Prints `<name>: N=<n> seconds=<s> events_per_s=<r> results=<k> exact=<bool>`
as its last line and writes W/result-<name>.json.
"""

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import fastavro
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

__all__ = ["main"]

HERE = os.path.dirname(os.path.abspath(__file__))
# Same binary layout as the job's schema, logical types dropped so longs stay ints.
PLAIN = fastavro.parse_schema({
    "type": "record", "name": "IpWindowCount", "namespace": "peerbench",
    "fields": [{"name": "window_start", "type": "long"}, {"name": "window_end", "type": "long"},
               {"name": "ip", "type": "string"}, {"name": "count", "type": "long"}],
})  # fmt: skip
TAIL_PREFIX = "198.51.100."
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime
    except (OSError, ValueError, IndexError):
        return None


def machine_busy():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


SINGLE_OBJECT = (
    b"\xc3\x01"  # Avro single-object encoding: marker + 8-byte fingerprint, then the body
)


def decode(value):
    if value[:2] == SINGLE_OBJECT:
        value = value[10:]
    buf = io.BytesIO(value)
    rec = fastavro.schemaless_reader(buf, PLAIN, None)
    if buf.tell() != len(value):
        raise ValueError("trailing bytes after Avro record")
    return rec


def reader(bootstrap, topic, parts, tag):
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{tag}-{os.getpid()}",
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
    })  # fmt: skip
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    return c


def run_tail(workdir, bootstrap):
    tail = [os.path.join(HERE, "load_input.py"), "tail", "--workdir", workdir]
    subprocess.run([sys.executable, *tail, "--bootstrap", bootstrap], check=True)


def _parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--name", default="job")
    ap.add_argument("--bootstrap", default="127.0.0.1:49092")
    ap.add_argument("--group", help="the job's consumer group (for tail=live and progress)")
    ap.add_argument("--tail", choices=["live", "preload"], default="live")
    ap.add_argument(
        "--linger", type=float, default=3.0, help="s to keep reading after the last expected result"
    )
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--poll", type=float, default=0.2, help="output check period, s")
    ap.add_argument("--broker-pid", type=int)
    ap.add_argument("--job-log", default=None)
    ap.add_argument(
        "--tail-results-ok",
        action="store_true",
        help="results for the tail's own windows are not an error (a job that closes idle "
        "windows emits them)",
    )
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    a.cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not a.cmd:
        sys.exit("bench: no job command given")
    if a.tail == "live" and not a.group:
        sys.exit("bench: --tail live needs --group")
    return a


def _load_truth(workdir):
    with open(os.path.join(workdir, "meta.json")) as f:
        meta = json.load(f)
    truth = {}
    with open(os.path.join(workdir, "truth.csv")) as f:
        next(f)
        for line in f:
            ws, ip, c = line.rstrip("\n").split(",")
            truth[(int(ws), ip)] = int(c)
    return meta, truth


class _Clock:
    """The job's run: launched, its output watched until every expected result was seen."""

    def __init__(self, a, meta, truth):
        self.a, self.meta, self.truth = a, meta, truth
        parts = meta["partitions"]
        self.ends = [meta["main_end_offsets"][str(p)] for p in range(parts)]
        self.out_tps = [TopicPartition(meta["out_topic"], p) for p in range(parts)]
        self.in_tps = [TopicPartition(meta["topic"], p) for p in range(parts)]
        self.read_upto = [0] * parts
        self.seen = set()
        self.events = {}
        self.tail_sent = a.tail == "preload"
        self.next_check = 0.0

    def run(self):
        """Launch the job and watch; returns when all results are in, the job exits, or the
        timeout passes. Sets t0, t_end and the CPU samples."""
        a, meta = self.a, self.meta
        # noida-db answers Fetch at once even when there is nothing new (no long
        # poll), so an assigned, unpaused consumer spins (~0.4 core here + ~0.35 in
        # the broker).  The watcher therefore stays paused and is resumed only when
        # ListOffsets (every --poll s) shows new data in the output topic.
        watch = reader(a.bootstrap, meta["out_topic"], meta["partitions"], "watch")
        watch.consume(1, 0.5)  # connect before the clock starts
        watch.pause(self.out_tps)
        self.prog = (
            Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group})
            if a.tail == "live"
            else None
        )
        log = open(a.job_log or os.path.join(a.workdir, f"{a.name}.log"), "w")
        self.broker_cpu0 = cpu_seconds(a.broker_pid) if a.broker_pid else None
        self.mach0 = machine_busy()
        self.self0 = cpu_seconds(os.getpid())
        self.t0 = time.time()
        self.job = subprocess.Popen(a.cmd, stdout=log, stderr=subprocess.STDOUT)
        self._watch(watch)
        self.t_end = time.time()
        self.job_cpu = cpu_seconds(self.job.pid)
        self.mach1 = machine_busy()
        self.self1 = cpu_seconds(os.getpid())
        self.broker_cpu1 = cpu_seconds(a.broker_pid) if a.broker_pid else None
        if "all_results" in self.events:
            time.sleep(a.linger)  # let any duplicate/extra show up
        self._stop_job()
        watch.close()

    def _all_seen(self):
        truth, seen = self.truth, self.seen
        return truth and len(seen) >= len(truth) and all(k in seen for k in truth)

    def _watch(self, watch):
        a, events, t0 = self.a, self.events, self.t0
        while True:
            now = time.time()
            if now - t0 > a.timeout:
                events["timeout"] = True
                break
            if self.job.poll() is not None:
                events["job_exited"] = self.job.returncode
                break
            self._tail_when_input_committed(now)
            hw = [
                watch.get_watermark_offsets(tp, timeout=5, cached=False)[1] for tp in self.out_tps
            ]
            if any(h > r for h, r in zip(hw, self.read_upto)):
                self._read_new(hw)
            else:
                time.sleep(a.poll)
            if self._all_seen():
                events["all_results"] = time.time() - t0
                break

    def _tail_when_input_committed(self, now):
        """tail=live: append the tail once the job's group committed the main data's end."""
        if self.tail_sent:
            return
        if now >= self.next_check:
            self.next_check = now + 0.25
            try:
                com = self.prog.committed(self.in_tps, timeout=5)
                if all(tp.offset >= e for tp, e in zip(com, self.ends)):
                    self.events["input_committed"] = now - self.t0
            except Exception:  # noqa: S110  (the group is not known yet: ask again)
                pass
        if "input_committed" in self.events:
            run_tail(self.a.workdir, self.a.bootstrap)
            self.tail_sent = True
            self.events["tail_sent"] = time.time() - self.t0

    def _read_new(self, hw):
        # A fresh reader from where the last one stopped: a long-paused consumer on noida-db
        # was seen to sit 15-45 s before fetching committed records (harness artefact).
        rd = Consumer({
            "bootstrap.servers": self.a.bootstrap, "group.id": f"bench-rd-{os.getpid()}",
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        })  # fmt: skip
        topic = self.meta["out_topic"]
        rd.assign([TopicPartition(topic, p, r) for p, r in enumerate(self.read_upto)])
        until = time.time() + 5.0
        while time.time() < until:
            for m in rd.consume(1000, 0.05):
                if m.error():
                    continue
                r = decode(m.value())
                self.seen.add((r["window_start"], r["ip"]))
                self.events.setdefault("first_result", time.time() - self.t0)
            # A partition with nothing new in this read reports an invalid position (-1001):
            # take the larger of it and where this reader started (cost up to 5 s otherwise).
            pos = [max(tp.offset, r) for tp, r in zip(rd.position(self.out_tps), self.read_upto)]
            if all(p >= h for p, h in zip(pos, hw)) or self._all_seen():
                break
        self.read_upto = [
            max(tp.offset, r) for tp, r in zip(rd.position(self.out_tps), self.read_upto)
        ]
        rd.close()
        if os.environ.get("BENCH_DEBUG"):
            print(
                f"watch t={time.time() - self.t0:.2f} hw={hw} read_upto={self.read_upto} "
                f"seen={len(self.seen)}",
                file=sys.stderr,
            )

    def _stop_job(self):
        job = self.job
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(30)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()


def _reread(a, meta):
    """Every result in the output topic (read_committed), by (window start, IP); records read,
    and those undecodable or with a wrong window length."""
    parts, topic = meta["partitions"], meta["out_topic"]
    chk = reader(a.bootstrap, topic, parts, "verify")
    hw = [chk.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(parts)]
    got = defaultdict(list)
    bad, records, last_msg = 0, 0, time.time()
    while time.time() - last_msg < 5:
        for m in chk.consume(5000, 0.5):
            if m.error():
                continue
            last_msg = time.time()
            records += 1
            try:
                r = decode(m.value())
            except Exception:  # noqa: BLE001
                bad += 1
                continue
            if r["window_end"] - r["window_start"] != meta["window_ms"]:
                bad += 1
            got[(r["window_start"], r["ip"])].append(r["count"])
        pos = chk.position([TopicPartition(topic, p) for p in range(parts)])
        if all(tp.offset >= h for tp, h in zip(pos, hw)):
            break
    chk.close()
    return got, records, bad


def _verdict(a, truth, got, records, bad):
    tail_results = sum(len(v) for k, v in got.items() if k[1].startswith(TAIL_PREFIX))
    dups = sum(len(v) - 1 for v in got.values() if len(v) > 1)
    missing = sum(1 for k in truth if k not in got)
    wrong = sum(1 for k, c in truth.items() if k in got and any(x != c for x in got[k]))
    extra = sum(1 for k in got if k not in truth and not k[1].startswith(TAIL_PREFIX))
    lost_events = sum(c - got[k][0] for k, c in truth.items() if k in got and got[k][0] < c) + sum(
        c for k, c in truth.items() if k not in got
    )
    exact = (
        bool(truth)
        and missing == wrong == dups == extra == bad == 0
        and (a.tail_results_ok or tail_results == 0)
    )
    return {
        "results": records, "expected_results": len(truth), "exact": exact, "missing": missing,
        "wrong_count": wrong, "duplicates": dups, "extra": extra,
        "undecodable_or_bad_window": bad, "tail_results": tail_results,
        "events_not_counted": lost_events,
    }  # fmt: skip


def _cpu_figures(a, clock, wall):
    job_cpu = clock.job_cpu
    res = {
        "job_cpu_s": job_cpu,
        "job_cpu_util": round(job_cpu / wall, 2) if job_cpu else None,
        "broker_cpu_s": (
            round(clock.broker_cpu1 - clock.broker_cpu0, 2)
            if clock.broker_cpu0 is not None
            else None
        ),
    }
    if res["broker_cpu_s"] is not None:
        res["broker_cpu_util"] = round(res["broker_cpu_s"] / wall, 2)
    # whole machine, in cores busy; "other" = everything but job, broker and this
    # driver (a busy neighbour on the 2-core box makes the figures meaningless)
    ncpu = os.cpu_count() or 1
    mach0, mach1 = clock.mach0, clock.mach1
    res["machine_cpu_util"] = round((mach1[0] - mach0[0]) / (mach1[1] - mach0[1]) * ncpu, 2)
    res["driver_cpu_util"] = round((clock.self1 - clock.self0) / wall, 2)
    res["other_cpu_util"] = round(
        res["machine_cpu_util"]
        - (res["job_cpu_util"] or 0)
        - res.get("broker_cpu_util", 0)
        - res["driver_cpu_util"],
        2,
    )
    return res


def main():
    """Time one job command against the input `load_input.py load` wrote; exit 0 if exact."""
    a = _parse_args()
    meta, truth = _load_truth(a.workdir)
    if a.tail == "preload":
        run_tail(a.workdir, a.bootstrap)
    clock = _Clock(a, meta, truth)
    clock.run()
    verdict = _verdict(a, truth, *_reread(a, meta))
    n = meta["n"]
    secs = clock.events.get("all_results", clock.t_end - clock.t0)
    wall = clock.t_end - clock.t0
    res = {"name": a.name, "n": n, "seconds": round(secs, 2), "events_per_s": round(n / secs)}
    res.update(verdict)
    res["events"] = {
        k: (round(v, 2) if isinstance(v, float) else v) for k, v in clock.events.items()
    }
    res.update(_cpu_figures(a, clock, wall))
    res.update({"tail": a.tail, "cmd": a.cmd})
    with open(os.path.join(a.workdir, f"result-{a.name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))
    print(
        f"{a.name}: N={n} seconds={secs:.2f} events_per_s={n / secs:.0f} "
        f"results={verdict['results']} exact={'true' if verdict['exact'] else 'false'}"
    )
    sys.exit(0 if verdict["exact"] else 1)


if __name__ == "__main__":
    main()
