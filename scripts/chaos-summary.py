#!/usr/bin/env python3
"""Prints a Markdown table of every chaos run report (chaos-*.json) in the directory given."""
import glob
import json
import os
import sys


def row(path):
    r = json.load(open(path))
    f, p, rp = r["faults"], r["processors"], r["replays"]
    failed = [i["name"] for i in r["invariants"] if not i["ok"]]
    # The brokers' own account of replication, when the run had a cluster (chaos.sh writes it).
    isr_path = os.path.join(os.path.dirname(path), "isr-" + os.path.basename(path))
    isr = json.load(open(isr_path)) if os.path.exists(isr_path) else {}
    return {
        "file": os.path.basename(path),
        "seed": r["seed"],
        "duration_s": r["duration_s"],
        "verdict": ("control, caught: " if r.get("control") else "") + r["verdict"]
        + (f" ({', '.join(failed)})" if failed else ""),
        "passed": r["passed"],
        "control": bool(r.get("control")),
        "records": int(r["setup"]["records"]),
        "kill": f.get("kill", 0),
        "pause": f.get("pause", 0),
        "restart_db": f.get("restart_db", 0),
        "restart_broker": f.get("restart_broker", 0),
        "failover": f.get("failover", 0),
        "rewound": p.get("positions_rewound", 0),
        "isr_shrinks": isr.get("isr_shrinks", 0),
        "isr_rejoins": isr.get("isr_expansions", 0),
        "under_replicated_end": isr.get("under_replicated_partitions_at_end", 0),
        "join": f.get("join", 0),
        "leave": f.get("leave", 0),
        "moves": p.get("partition_moves", 0),
        "retries": r.get("retries", 0),
        "replayed": rp.get("replayed_records", 0),
        "avoided": rp.get("replays_avoided", 0),
        "gaps": p.get("offset_gaps", 0),
        "regressions": len(r["offsets"].get("regressions", [])),
        "drained_s": r["throughput"].get("drained_after_s", 0.0),
        "broker": r["setup"].get("broker", ""),
        "protocol": r["setup"].get("group_protocol", "classic"),
    }


def main():
    runs = sorted(
        (row(p) for p in glob.glob(os.path.join(sys.argv[1], "chaos-*.json"))),
        key=lambda r: (r["duration_s"], r["seed"], r["file"]),
    )
    cols = ["seed", "duration_s", "verdict", "records", "kill", "pause", "restart_db",
            "restart_broker", "failover", "rewound", "isr_shrinks", "isr_rejoins", "under_replicated_end", "join", "leave", "moves", "retries", "replayed", "avoided", "gaps", "regressions", "drained_s"]
    print(f"# Chaos runs ({len(runs)})\n")
    setups = sorted({(r["broker"], r["protocol"]) for r in runs})
    for broker, protocol in setups:
        print(f"- broker: {broker or 'not recorded'}; group protocol: {protocol}")
    print()
    safe = [r for r in runs if not r["control"]]
    controls = [r for r in runs if r["control"]]
    print(f"{sum(r['passed'] for r in safe)} of {len(safe)} runs passed every invariant.")
    if controls:
        print(f"{sum(not r['passed'] for r in controls)} of {len(controls)} control runs (an unsafe "
              "configuration) failed it, as they must.")
    print()
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in runs:
        cells = [f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        print("| " + " | ".join(cells) + " |")
    total = {c: sum(r[c] for r in runs) for c in cols[3:] if c != "drained_s"}
    print("| total | " + f"{sum(r['duration_s'] for r in runs):.0f} | | "
          + " | ".join(str(total[c]) for c in cols[3:] if c != "drained_s") + " | |")
    print("\nColumns: faults injected (kill = SIGKILL, pause = SIGSTOP past the session timeout, "
          "restart_db = PostgreSQL stopped -m immediate, restart_broker = a Kafka node SIGKILLed and "
          "started again on its own log, failover = the replication to an asynchronous replica cut, "
          "the primary SIGKILLed seconds later and the replica promoted, rewound = partitions the "
          "processors read again from the database's position after it went back (WARN lines), "
          "isr_shrinks = a leader's ISR changes to fewer than all "
          "nodes in the brokers' logs (a replica that fell behind; the controller's removal of a "
          "fenced, killed node is not logged there), isr_rejoins = ISR changes back to all nodes "
          "(a replica caught up again, after either), under_replicated_end = partitions under-replicated after the run, join/leave = members added/removed), "
          "partition moves, transient retries, records replayed to a processor and replays avoided "
          "by the offsets in the database (lower bounds), offset gaps seen by the workers, "
          "committed-offset regressions seen by the watcher (after a failover: back to the promoted "
          "database's position, never below it), seconds until the group drained.")


main()
