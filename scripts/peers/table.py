"""The table of scripts/peers/compare.sh: results.md, rows.jsonl and machine.json in OUT.

python3 scripts/peers/table.py ROWS.jsonl EXPECT.json OUT BROKER MESSAGES PARTITIONS ACCOUNTS FLUSH_MS
"""

import datetime
import json
import os
import platform
import re
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
work_of = lambda r: r.get("work", "upsert")
works = [w for w in ("upsert", "additive") if any(work_of(r) == w for r in rows)]
machine["work"] = works
json.dump(machine, open(os.path.join(out, "machine.json"), "w"), indent=2)


def measured(r):
    """A kill run's msgs/s and CPU are not measured."""
    return "kill" not in r["label"]


def rate_and_cpu(r):
    c = r["cpu_ms_per_1k"]
    rate = f"{r['msgs_per_s']:,}" if measured(r) else "-"
    cpu = [f"{c[k]:.0f}" if measured(r) else "-" for k in ("sink", "postgres", "broker", "machine")]
    return f"{rate} | {' | '.join(cpu)}"


CPU = ("CPU is in ms per 1000 records, over the run's wall time: the sink process (the Connect JVM "
       "after its task started, or our processor from start to exit), PostgreSQL (every backend), "
       "the broker, and the whole machine (other work included). A kill run's msgs/s and CPU are "
       "not measured (`-`).")

lines = [
    "# batch-inbox and Kafka Connect + Debezium's JDBC sink, the same input",
    "",
    f"Written by `scripts/peers/compare.sh` on {machine['date_utc']} UTC: {machine['cores']} cores "
    f"({machine['cpu']}), {machine['memory_gib']} GiB, **shared with other builds and test runs "
    f"during the measurement** (load average at the end: {' '.join(load)}). Broker: {broker}.",
    "",
    f"Input: {messages} records on {partitions} partitions, {accounts} customers (keys, one account "
    f"each), {expect['new']} new records and {expect['duplicates']} duplicates (records re-sent with "
    "the id and value of an earlier one), as a Kafka Connect JSON envelope "
    "(`batch-inbox-bench produce --envelope connect-json --bad-ratio 0`). The same topic for every "
    "run; each run on a database of its own.",
    "",
]

if "upsert" in works:
    lines += [
        "## Last write wins",
        "",
        "The latest entry per customer on the same table (`examples/sql/customer_entries.ddl.sql`): "
        "ours `examples/sql/customer_entries.sql`, the peer in upsert mode "
        "(`scripts/peers/connector.properties`). " + CPU,
        "",
        "| run | msgs/s | sink CPU | PostgreSQL CPU | broker CPU | machine CPU | rows = last new of key | rows = last in topic | writes | ids applied twice | writes added by the kill | note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    up = [r for r in rows if work_of(r) == "upsert"]
    # A kill run's writes beyond those of the same sink's run without a kill (its default
    # configuration): what the restart applied again.
    writes = {r["label"]: r["state"]["applications"] for r in up}
    for r in up:
        s = r["state"]
        b = "connect-default" if r["label"].startswith("connect-kill") else None
        added = f"{s['applications'] - writes[b]:,}" if b in writes else "-"
        lines.append(
            f"| {r['label']} | {rate_and_cpu(r)} | {s['match_last_new']} / {keys} | "
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
        "without a kill.",
        "",
    ]

if "additive" in works:
    sums = expect["sums"]
    lines += [
        "## Additive: balance += amount",
        "",
        "Each account's balance is the sum of the amounts of its records, each record counted once: "
        f"the model is the sum of the new records' amounts per account ({len(sums)} accounts, "
        f"{sum(sums.values()):,} in all; no overdraft rule on either side). Ours adds each batch's "
        "new amounts to `balances` (`examples/sql/balances_connect.sql`, one aggregate "
        "`INSERT … ON CONFLICT (account_id) DO UPDATE SET amount = balances.amount + "
        "excluded.amount` per batch). Our reference ledger (`additive-batch-inbox-ledger`, "
        "`--handler ledger`) reads the entry itself, not an envelope: it runs on the same entries "
        "produced once more without it (the same seed: the same accounts, amounts and "
        "duplicates, with ids of their own; a topic of its own; the same model), and "
        "since it refuses overdrafts it is checked against the model's ledger balances, exactly "
        "(`batch-inbox-bench verify`). Debezium's JDBC sink has no statement that adds to a column, "
        "so it keeps a row per record and its balance is `sum(amount) GROUP BY account_id` over "
        "them, in two ways: `additive-connect-*` inserts a row per record it receives into "
        "`amount_entries` (`scripts/peers/connector-amounts.properties`: `insert.mode=insert`, "
        "`primary.key.mode=none`, a key the database generates); `additive-by-id-connect-*` "
        "upserts a row per record id into `amount_entries_by_id` "
        "(`scripts/peers/connector-amounts-by-id.properties`: `insert.mode=upsert`, "
        "`primary.key.mode=record_value`, `primary.key.fields=id`, the id the payload carries), "
        "so that a record received again overwrites its own row. The peer's runs are timed until "
        "its table holds a row per record of the topic (insert) or per new id (by id). " + CPU,
        "",
        "| run | msgs/s | sink CPU | PostgreSQL CPU | broker CPU | machine CPU | accounts = model | total absolute error | total − model's total | rows | records counted twice | counted twice added by the kill | note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    ad = [r for r in rows if work_of(r) == "additive"]
    twice = {r["label"]: r["state"]["counted_twice"] for r in ad}

    def n(v):
        return "-" if v is None else f"{int(v):,}"

    for r in ad:
        s = r["state"]
        # The same sink's run without a kill, in its default configuration.
        b = re.sub(r"kill-\d+$", "default", r["label"]) if "connect-kill" in r["label"] else None
        added = f"{s['counted_twice'] - twice[b]:,}" if twice.get(b) is not None else "-"
        lines.append(
            f"| {r['label']} | {rate_and_cpu(r)} | {s['accounts_right']} / {s['accounts']} | "
            f"{n(s['abs_error'])} | {n(int(s['total']) - int(s['model_total']))} | {n(s['entries'])} | "
            f"{n(s['counted_twice'])} | {added} | {r['note']} |"
        )
    lines += [
        "",
        "*accounts = model*: accounts whose balance equals the model's sum, of the accounts in the "
        "model or in the table; *total absolute error*: the sum over accounts of |balance − the "
        "model's sum| (amounts are credits and debits, so a record counted twice adds its "
        "|amount| or cancels against another one of the same account); *total − model's total*: "
        "the sum of all balances less the model's; *rows*: the peer's rows in its table (one per "
        "record inserted, or per id upserted); *records counted twice*: the inserting peer's rows "
        "beyond the first of each record id (`-` where a primary key holds each id once: our "
        "inbox, the peer's table by id; their balances are the check); *counted twice added by "
        "the kill*: a kill run's records counted twice less those of the same sink's run without "
        "a kill.",
        "",
    ]

open(os.path.join(out, "results.md"), "w").write("\n".join(lines))
print("\n".join(lines))
