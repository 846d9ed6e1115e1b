"""The table of scripts/peers/compare.sh: results.md, rows.jsonl and machine.json in OUT.

python3 scripts/peers/table.py ROWS.jsonl EXPECT.json OUT BROKER MESSAGES PARTITIONS ACCOUNTS FLUSH_MS
"""

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys

rows_path, expect_path, out, broker, messages, partitions, accounts, flush_ms = sys.argv[1:9]
rows = [json.loads(line) for line in open(rows_path)]
expect = json.load(open(expect_path))
keys = len(expect["last_new"])
os.makedirs(out, exist_ok=True)
shutil.copy(rows_path, os.path.join(out, "rows.jsonl"))


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
load = open("/proc/loadavg").read().split()[:3]
machine = {
    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
    "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
    "cores": os.cpu_count(),
    "memory_gib": round(mem / 1048576, 1),
    "kernel": platform.release(),
    "load_average_at_end": load,
    "shared": "2 cores shared with other builds and test runs during the measurement",
    "postgres": sh("psql", "-X", "-Atq", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c", "SELECT version()"),
    "java": sh("sh", "-c", "java -version 2>&1 | head -n 1"),
    "broker": broker,
    "input": {"records": int(messages), "partitions": int(partitions), "customers": int(accounts),
              "new": expect["new"], "duplicates": expect["duplicates"]},
    "peer_offset_flush_interval_ms": int(flush_ms),
}
json.dump(machine, open(os.path.join(out, "machine.json"), "w"), indent=2)

lines = [
    "# batch-inbox and Kafka Connect + Debezium's JDBC sink, the same input",
    "",
    f"Written by `scripts/peers/compare.sh` on {machine['date_utc']} UTC: {machine['cores']} cores "
    f"({machine['cpu']}), {machine['memory_gib']} GiB, **shared with other builds and test runs "
    f"during the measurement** (load average at the end: {' '.join(load)}). Broker: {broker}.",
    "",
    f"Input: {messages} records on {partitions} partitions, {accounts} customers (keys), "
    f"{expect['new']} new records and {expect['duplicates']} duplicates (records re-sent with the id "
    "and value of an earlier one), as a Kafka Connect JSON envelope "
    "(`batch-inbox-bench produce --envelope connect-json --bad-ratio 0`).",
    "",
    "Last write wins per customer on the same table (`examples/sql/customer_entries.ddl.sql`). "
    "CPU is in ms per 1000 records, over the run's wall time: the sink process (the Connect JVM "
    "after its task started, or our processor from start to exit), PostgreSQL (every backend), "
    "the broker, and the whole machine (other work included).",
    "",
    "| run | msgs/s | sink CPU | PostgreSQL CPU | broker CPU | machine CPU | rows = last new of key | rows = last in topic | writes | ids applied twice | writes added by the kill | note |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
]
# A kill run's writes beyond those of the same sink's run without a kill (its default
# configuration): what the restart applied again.
writes = {r["label"]: r["state"]["applications"] for r in rows}
for r in rows:
    s, c = r["state"], r["cpu_ms_per_1k"]
    b = "connect-default" if r["label"].startswith("connect-kill") else None
    added = f"{s['applications'] - writes[b]:,}" if b in writes else "-"
    measured = r["wall_s"] > 1
    rate = f"{r['msgs_per_s']:,}" if measured else "-"
    cpu = [f"{c[k]:.0f}" if measured else "-" for k in ("sink", "postgres", "broker", "machine")]
    lines.append(
        f"| {r['label']} | {rate} | {' | '.join(cpu)} | {s['match_last_new']} / {keys} | "
        f"{s['match_last_sent']} / {keys} | {s['applications']:,} | {s['ids_applied_twice']:,} | {added} | {r['note']} |"
    )
lines += [
    "",
    "*rows = last new of key*: customers whose row holds the last record of its key that carried a "
    "new id (the model when each record is applied once); *rows = last in topic*: the last record "
    "of its key in the topic, duplicates included (what a sink that applies every record it reads "
    "leaves). *writes*: row writes the trigger logged (our statement writes the newest record of "
    "each key in a batch, so fewer than the records); *ids applied twice*: record ids written more "
    "than once; *writes added by the kill*: the peer's kill run's writes less those of its run "
    "without a kill. A kill run's msgs/s and CPU are not measured (`-`).",
    "",
]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines))
print("\n".join(lines))
