#!/usr/bin/env bash
# NATS JetStream at fixed rates: the batched default on STREAMS streams, the input published paced
# at each rate for SECONDS_PER_RATE seconds (ledger entries, 10% duplicates, 1% bad input, each
# publish acknowledged), each record's latency from its `timestamp_in_ms` header (its intended
# send time, set by the publisher) to its batch's COMMIT, as the processor's stats file measures
# it; each run checked against the model of what the streams stored (`drain --expect`). On a
# nats-server of the run's own and the machine's PostgreSQL, like compare.sh.
#
#   scripts/nats/latency.sh                        RATES="1000 5000 10000 20000", results/nats/
#   RATES=1000 SECONDS_PER_RATE=5 OUT=/tmp/l scripts/nats/latency.sh
#
# The streams drop a publish whose `Nats-Msg-Id` they saw within their duplicate window (the
# default, 2 minutes), so the processor reads fewer records than were published; it is stopped
# (SIGTERM: it finishes its batches) once it committed every record the streams stored.
#
# Environment: RATES, SECONDS_PER_RATE (20), STREAMS (4), ACCOUNTS (1000), OUT (results/nats:
# latency.md and latency.jsonl), MACHINE_NOTE (what else ran meanwhile).
# Databases: ${TEST_DATABASE_PREFIX:-bi_}nats_latency_*.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

RATES=${RATES:-1000 5000 10000 20000}
SECONDS_PER_RATE=${SECONDS_PER_RATE:-20}
STREAMS=${STREAMS:-4}
ACCOUNTS=${ACCOUNTS:-1000}
OUT=${OUT:-results/nats}
PREFIX=${TEST_DATABASE_PREFIX:-bi_}
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
log() { echo "[$(date +%T)] $*" >&2; }

ensure_postgres
ensure_nats
log "building the release binaries"
cargo build --release -q -p batch-inbox -p batch-inbox-tools --bins
work=$(mktemp -d /tmp/nats-latency.XXXXXX)
drain_pid=""
cleanup() {
  [ -n "$drain_pid" ] && kill "$drain_pid" 2>/dev/null
  stop_nats "$work/server"
  rm -rf "$work"
}
trap cleanup EXIT
start_nats "$work/server"
version=$(nats-server --version | sed 's/^nats-server: *//')
log "nats-server $version on ${NATS_URL#*@}"
mkdir -p "$OUT"
: >"$work/latency.jsonl"

# committed FILE: sets COMMITTED to the records the processor's stats file (written every 100 ms)
# counts, 0 until it exists. Bash alone, no process started: it runs beside the measured run.
committed() {
  local text=""
  COMMITTED=0
  [ -f "$1" ] && text=$(<"$1")
  [[ $text =~ \"stats\":\ *\{[^}]*\"records\":\ *([0-9]+) ]] && COMMITTED=${BASH_REMATCH[1]}
  return 0
}

for rate in $RATES; do
  run="r$rate" n=$((rate * SECONDS_PER_RATE)) db="${PREFIX}nats_latency_r$rate" name="lat-$rate"
  s=()
  if [ "$STREAMS" = 1 ]; then
    s=(--stream "$name")
  else
    for i in $(seq 0 $((STREAMS - 1))); do s+=(--stream "$name-$i"); done
  fi
  # The streams, empty: the processor reads only streams that exist.
  $bench nats-publish --url "$NATS_URL" --stream "$name" --streams "$STREAMS" --create-stream \
    --messages 0 >/dev/null
  fresh_database "$db"
  export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db"
  $bin migrate >/dev/null
  log "$run: $n records at $rate/s"
  # The processor waits on its empty streams; it is stopped below once it committed them all.
  RUST_LOG=warn $bench drain --label "nats-$run" --report "$work/$run.json" \
    --input-rate "$rate" --expect "$work/$run.expect.json" -- \
    $bin run --source "$NATS_URL" "${s[@]}" --consumer batch-inbox --log-interval 0 \
    >"$work/$run.out" 2>"$work/$run.err" &
  drain_pid=$!
  # Until every stream has the processor's consumer (at most 60 s).
  ready=0
  for _ in $(seq 1 600); do
    ready=0
    for ((i = 1; i < ${#s[@]}; i += 2)); do
      c=$($bench nats-stream-info --url "$NATS_URL" --stream "${s[i]}" 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["consumers"])' 2>/dev/null || echo 0)
      [ "$c" -ge 1 ] && ready=$((ready + 1))
    done
    [ "$ready" -ge "$STREAMS" ] && break
    kill -0 "$drain_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ "$ready" -lt "$STREAMS" ]; then
    log "$run: the processor reads $ready of $STREAMS streams after 60 s"
    cat "$work/$run.err" >&2
    exit 1
  fi
  $bench nats-publish --url "$NATS_URL" --stream "$name" --streams "$STREAMS" --rate "$rate" \
    --messages "$n" --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0.01 --seed 3 \
    --expect "$work/$run.expect.json" | tee "$work/$run.published" >&2
  stored=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["records"])' "$work/$run.expect.json")
  # Until the processor committed every record the streams stored (at most 120 s more).
  for _ in $(seq 1 1200); do
    committed "$work/$run.json.stats"
    [ "$COMMITTED" -ge "$stored" ] && break
    kill -0 "$drain_pid" 2>/dev/null || break
    sleep 0.1
  done
  committed "$work/$run.json.stats"
  done_records=$COMMITTED
  # The processor, drain's child: SIGTERM, as an operator stops it; drain then checks the database.
  processor=$(pgrep -P "$drain_pid" || true)
  [ -n "$processor" ] && kill -TERM "$processor"
  if ! wait "$drain_pid" || [ "$done_records" -lt "$stored" ]; then
    drain_pid=""
    log "$run: the processor committed $done_records of the $stored records the streams stored"
    cat "$work/$run.err" >&2
    exit 1
  fi
  drain_pid=""
  python3 - "$work/$run.json" "$rate" "$n" "$stored" "$work/$run.published" >>"$work/latency.jsonl" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
# "published N records in S s (R/s)": the rate the publisher achieved.
achieved = float(re.search(r"\(([0-9.]+)/s\)", open(sys.argv[5]).read()).group(1))
pick = lambda p: {k: round(p[k], 1) for k in ("p50", "p90", "p99", "p999", "max")}
print(json.dumps({"rate": int(sys.argv[2]), "achieved": round(achieved), "published": int(sys.argv[3]),
  "records": int(sys.argv[4]), "verified": r.get("verified"), "e2e_ms": pick(r["e2e_latency_ms"]),
  "receive_ms": pick(r["receive_latency_ms"]), "batch_size_p50": r["batch_size"]["p50"]}))
PY
done

cp "$work/latency.jsonl" "$OUT/latency.jsonl"
python3 - "$work/latency.jsonl" "$OUT/latency.md" "$STREAMS" "$version" "$SECONDS_PER_RATE" \
  "${MACHINE_NOTE:-other work on the machine during the measurement not stated}" \
  "$(uptime | sed 's/.*load average: //')" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out, streams, version, secs, note, load = sys.argv[2:8]
lines = [
  "# batch-inbox on NATS JetStream at fixed rates",
  "",
  f"Written by `scripts/nats/latency.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC: nats-server {version} (one server, JetStream file store), PostgreSQL on the same host, **{note}** (load average at the end: {load}).",
  "",
  f"The batched default on {streams} streams (each account's records to one), waiting on them empty; then {secs} s of input published paced at each rate, each publish acknowledged by its stream (ledger entries, 10% duplicates, 1% bad input; the streams drop the publishes whose `Nats-Msg-Id` they saw within their 2-minute duplicate window, so the processor reads the records stored), every run checked against the model. Latency per record in ms: end to end from the `timestamp_in_ms` header the publisher sets (the record's intended send time) to its batch's COMMIT; receive from that header to its arrival at the stream's worker (publisher, server and client).",
  "",
  "| msgs/s | published at | published | stored | end to end p50 | p90 | p99 | p99.9 | max | receive p50 | receive p99 | batch size p50 | checked |",
  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
]
for r in rows:
    e, v = r["e2e_ms"], r["receive_ms"]
    short = " (short of the rate)" if r["achieved"] < 0.95 * r["rate"] else ""
    lines.append(f"| {r['rate']:,} | {r['achieved']:,}{short} | {r['published']:,} | {r['records']:,} | {e['p50']} | {e['p90']} | {e['p99']} | {e['p999']} | {e['max']} | {v['p50']} | {v['p99']} | {r['batch_size_p50']} | {'exact' if r['verified'] else r['verified']} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
