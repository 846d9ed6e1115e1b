#!/usr/bin/env python3
"""Summarizes replay runs (JSON lines of examples/replay_db, with a "round" each).

    scripts/replay-summary.py RUNS.jsonl [BASELINE_LABEL]

Per configuration: the median and range of records/s, PostgreSQL CPU µs/record, the replay's own
CPU µs/record, WAL bytes/record and statements per transaction; and the median and range of its
ratio to the baseline (the first label unless given) over the rounds both ran in. A run whose
database did not match the model is flagged.
"""
import json
import statistics
import sys
from collections import defaultdict

FIELDS = [
    ("records_per_s", "records/s", 0),
    ("pg_cpu_us_per_record", "PG CPU µs/rec", 2),
    ("replay_cpu_us_per_record", "replay CPU µs/rec", 2),
    ("wal_bytes_per_record", "WAL B/rec", 0),
    ("statements_per_transaction", "statements/tx", 2),
]
RATIOS = ["records_per_s", "pg_cpu_us_per_record", "wal_bytes_per_record"]


def spread(values, digits):
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}–{max(values):.{digits}f}]"


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    by_label = defaultdict(list)
    for run in runs:
        by_label[run["label"]].append(run)
    base_label = sys.argv[2] if len(sys.argv) > 2 else runs[0]["label"]
    base = {run["round"]: run for run in by_label[base_label]}
    header = ["configuration", "runs"] + [name for _, name, _ in FIELDS]
    header += [f"{name} ÷ {base_label}" for key, name, _ in FIELDS if key in RATIOS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, group in by_label.items():
        cells = [label, str(len(group))]
        for key, _, digits in FIELDS:
            values = [r[key] for r in group if r.get(key) is not None]
            cells.append(spread(values, digits) if values else "–")
        for key in RATIOS:
            ratios = [r[key] / base[r["round"]][key] for r in group
                      if r["round"] in base and r.get(key) and base[r["round"]].get(key)]
            cells.append(spread(ratios, 3) if ratios else "–")
        bad = sum(1 for r in group if r.get("differences"))
        if bad:
            cells[0] += f" (MISMATCH in {bad} runs)"
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
