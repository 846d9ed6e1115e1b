#!/usr/bin/env python3
"""Where a recovered database differs from its input, record by record.

    recovery-check.py TOPIC_DUMP DATABASE_URL TOPIC

TOPIC_DUMP is the topic as Kafka's ConsoleConsumer prints it (partition, offset, headers, key,
value; a null value as NULL, see read_topic in scripts/recovery-lib.sh). The model check
(`batch-inbox-bench verify`) says whether the database is exactly the model; this says why not:

- lost: valid ids of the topic absent from the inbox, and bad records without their dead letter,
  with the offset ranges they sit in per partition;
- applied twice: the inbox's own rows replayed through the ledger's rule (each id applied once,
  at the position the inbox recorded, in offset order per partition) must give exactly the
  database's balances and insufficient-funds dead letters. Any other difference is an effect
  applied more than once (or applied without its inbox row), never a loss.

Prints one JSON object.
"""

import json
import re
import subprocess
import sys
import uuid

I64 = (-(2**63), 2**63 - 1)
RULES = ("insufficient_funds", "amount_overflow")


def psql(url, sql):
    out = subprocess.run(["psql", "-X", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                         capture_output=True, text=True, check=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def parse_id(headers):
    """The decoder's id rules: exactly one `id` header, a UUID, not nil or max."""
    ids = [v for k, v in headers if k == "id"]
    if len(ids) != 1:
        return None
    try:
        u = uuid.UUID(ids[0].strip())
    except ValueError:
        return None
    if u.int in (0, 2**128 - 1):
        return None
    return u


def parse_entry(value):
    if value is None or value.strip() == "" or not value.lstrip().startswith("{"):
        return None
    try:
        v = json.loads(value)
    except ValueError:
        return None
    a, m = v.get("account_id"), v.get("amount")
    ok = all(isinstance(x, int) and not isinstance(x, bool) and I64[0] <= x <= I64[1] for x in (a, m))
    return (a, m) if ok else None


def read_topic(path):
    """{(partition, offset): (id or None, (account, amount) or None)}"""
    records = {}
    line_re = re.compile(r"^Partition:(\d+)\tOffset:(\d+)\t(.*?)\t(.*?)\t(.*)$")
    for line in open(path, encoding="utf-8", errors="replace"):
        m = line_re.match(line.rstrip("\n"))
        if not m:
            continue
        p, o, headers, _key, value = m.groups()
        pairs = [] if headers == "NO_HEADERS" else [h.split(":", 1) for h in headers.split(",")]
        value = None if value == "NULL" else value
        records[(int(p), int(o))] = (parse_id(pairs), parse_entry(value))
    return records


def spans(positions):
    """["p0: 12 between offsets 3130 and 4411", ...]: per partition, how many and where."""
    by = {}
    for p, o in positions:
        by.setdefault(p, []).append(o)
    return [f"p{p}: {len(o)} between offsets {min(o)} and {max(o)}" for p, o in sorted(by.items())]


def main():
    dump, url, topic = sys.argv[1:4]
    records = read_topic(dump)
    valid = {}
    bad = set()
    for pos, (mid, entry) in sorted(records.items()):
        if mid is not None and entry is not None:
            valid.setdefault(mid, pos)  # the first copy's position
        else:
            bad.add(pos)
    inbox = {uuid.UUID(r[0]): (int(r[1]), int(r[2]))
             for r in psql(url, f"SELECT message_id, partition, \"offset\" FROM inbox WHERE topic = '{topic}'")}
    dead = {(int(r[0]), int(r[1])): r[2]
            for r in psql(url, f"SELECT partition, \"offset\", reason FROM dead_letters WHERE topic = '{topic}'")}
    balances = {int(r[0]): int(r[1]) for r in psql(url, "SELECT account_id, amount FROM balances")}

    lost_valid = {mid: pos for mid, pos in valid.items() if mid not in inbox}
    lost_bad = sorted(pos for pos in bad if pos not in dead)
    unknown = [str(mid) for mid in inbox if mid not in valid]
    # Every inbox row at a position of the topic that carries its id.
    misplaced = [str(mid) for mid, pos in inbox.items()
                 if mid in valid and (pos not in records or records[pos][0] != mid)]

    # The inbox's rows replayed once each, in offset order per partition.
    replay, refused = {}, set()
    for mid, pos in sorted(inbox.items(), key=lambda kv: kv[1]):
        entry = records.get(pos, (None, None))[1]
        if entry is None or mid in unknown:
            continue
        account, amount = entry
        balance = replay.setdefault(account, 0)
        if balance + amount > I64[1]:
            refused.add(pos)
        elif balance + amount < 0:
            refused.add(pos)
        else:
            replay[account] = balance + amount
    accounts = set(replay) | set(balances)
    differ = sorted(a for a in accounts if replay.get(a, 0) != balances.get(a, 0))
    rule_dead = {pos for pos, reason in dead.items() if reason in RULES}
    twice = bool(differ) or rule_dead != refused or bool(unknown) or bool(misplaced)

    print(json.dumps({
        "topic_records": len(records),
        "valid_ids": len(valid),
        "bad_records": len(bad),
        "inbox_rows": len(inbox),
        "lost_valid_ids": len(lost_valid),
        "lost_valid_where": spans(lost_valid.values()),
        "lost_dead_letters": len(lost_bad),
        "lost_dead_letters_where": spans(lost_bad),
        "ids_not_in_topic": len(unknown),
        "inbox_rows_at_wrong_position": len(misplaced),
        "balances_differing_from_inbox_replay": len(differ),
        "balances_differing_examples": [
            {"account": a, "database": balances.get(a, 0), "inbox_replay": replay.get(a, 0)} for a in differ[:5]],
        "rule_dead_letters_differing_from_inbox_replay": len(rule_dead ^ refused),
        "applied_twice": twice,
    }))


if __name__ == "__main__":
    main()
