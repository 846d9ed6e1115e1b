#!/usr/bin/env bash
# NATS JetStream in one run, on the same machine and database server as the Kafka and RabbitMQ
# load tests: the server's own floor (the streams read by pulls of a batch and acknowledged by
# their last message, nothing applied: `batch-inbox-bench nats-consume-only`), the per-message
# baseline (`--mode per-message`) and the batched default, each on the same generated input
# (ledger entries, 10% duplicates, 1% bad input, published with their id in `Nats-Msg-Id`) in
# streams of its own, on a nats-server of the run's own. Each run of ours is checked against the
# model of what the streams stored (`batch-inbox-bench verify`); the script fails when one
# differs.
#
#   scripts/nats/compare.sh                         MESSAGES=200000 STREAMS=4, results/nats/
#   MESSAGES=20000 OUT=target/nats-ci scripts/nats/compare.sh        (CI: under a minute)
#
# The streams keep JetStream's default duplicate window (2 minutes): a publish whose
# `Nats-Msg-Id` a stream saw within it is dropped, so the generator's re-sent records and the bad
# ones sharing an id never reach a reader; rates and CPU are per record the streams stored.
#
# Environment: MESSAGES (generated), STREAMS (each account's records go to one of them),
# BATCH_SIZE (1000: the processor's default, and the floor's pull), ACCOUNTS (1000), SEED (1),
# OUT (results/nats), MACHINE_NOTE (what else ran on the machine meanwhile, as the results state
# it). Databases: ${TEST_DATABASE_PREFIX:-bi_}nats_*.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

MESSAGES=${MESSAGES:-200000}
STREAMS=${STREAMS:-4}
BATCH_SIZE=${BATCH_SIZE:-1000}
ACCOUNTS=${ACCOUNTS:-1000}
SEED=${SEED:-1}
OUT=${OUT:-results/nats}
PREFIX=${TEST_DATABASE_PREFIX:-bi_}
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
log() { echo "[$(date +%T)] $*" >&2; }

ensure_postgres
ensure_nats
log "building the release binaries"
cargo build --release -q -p batch-inbox -p batch-inbox-tools --bins
work=$(mktemp -d /tmp/nats-compare.XXXXXX)
run_pid=""
trap '[ -n "$run_pid" ] && kill "$run_pid" 2>/dev/null; stop_nats "$work/server"; rm -rf "$work"' EXIT
start_nats "$work/server"
server_pid=$(cat "$work/server/pid")
version=$(nats-server --version | sed 's/^nats-server: *//')
log "nats-server $version on ${NATS_URL#*@}, pid $server_pid"
pg_data=$(psql -X -At -h 127.0.0.1 -U postgres -d postgres -c 'SHOW data_directory')
cpu=(--machine --postgres-data "$pg_data" --broker "$server_pid")
mkdir -p "$OUT"
: >"$work/rows.jsonl"

# streams RUN: the run's stream flags (nats-publish names them so with --streams).
streams() {
  local i
  if [ "$STREAMS" = 1 ]; then
    printf -- '--stream\nnats-%s\n' "$1"
  else
    for i in $(seq 0 $((STREAMS - 1))); do printf -- '--stream\nnats-%s-%s\n' "$1" "$i"; done
  fi
}
# publish RUN: the input into the run's streams (timed apart from the run); the model of what
# they stored to $work/RUN.expect.json.
publish() {
  log "$1: publishing $MESSAGES records to $STREAMS streams"
  $bench nats-publish --url "$NATS_URL" --stream "nats-$1" --streams "$STREAMS" --create-stream \
    --messages "$MESSAGES" --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0.01 \
    --seed "$SEED" --expect "$work/$1.expect.json" >&2
}
stored() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["records"])' "$work/$1.expect.json"; }
rate_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["msgs_per_sec"])' "$1"; }
# row RUN MSGS_PER_S CPU_JSON NOTE: one line of rows.jsonl, CPU per record the streams stored.
row() {
  python3 - "$1" "$2" "$3" "$4" "$(stored "$1")" "$MESSAGES" "$(nproc)" >>"$work/rows.jsonl" <<'PY'
import json, sys
run, rate, cpu_path, note, n, generated, cores = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
c = json.load(open(cpu_path))
per_k = lambda k: round(1e6 * (c.get(k) or 0.0) / n, 1)
cpu_s = lambda k: round(c.get(k) or 0.0, 2)
print(json.dumps({"run": run, "records": n, "generated": generated, "msgs_per_s": round(rate),
  "wall_s": round(c["wall_s"], 2), "cores": cores,
  "cpu_s": {"process": cpu_s("process_cpu_s"), "server": cpu_s("broker_cpu_s"),
  "postgres": cpu_s("postgres_cpu_s"), "machine": cpu_s("machine_cpu_s")},
  "cpu_ms_per_1k": {"process": per_k("process_cpu_s"), "server": per_k("broker_cpu_s"),
  "postgres": per_k("postgres_cpu_s"), "machine": per_k("machine_cpu_s")}, "note": note}))
PY
}

# The server's floor.
publish floor
mapfile -t s < <(streams floor)
log "floor: nats-consume-only"
$bench cpu run --out "$work/cpu.json" "${cpu[@]}" -- \
  $bench nats-consume-only --url "$NATS_URL" "${s[@]}" --batch-size "$BATCH_SIZE" \
  --out "$work/floor.json" >&2
[ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["records"])' "$work/floor.json")" = "$(stored floor)" ] ||
  { log "floor: read another count than the streams stored"; exit 1; }
row floor "$(rate_of "$work/floor.json")" "$work/cpu.json" \
  "pulled by $BATCH_SIZE, the last of each acknowledged (ack policy all), nothing applied; max_ack_pending $((2 * BATCH_SIZE))"

# committed FILE: sets COMMITTED to the records the processor's stats file counts (0 until it is
# written). Bash alone, no process started: it runs every 100 ms beside the measured run.
committed() {
  local text=""
  COMMITTED=0
  [ -f "$1" ] && text=$(<"$1")
  [[ $text =~ \"stats\":\ *\{[^}]*\"records\":\ *([0-9]+) ]] && COMMITTED=${BASH_REMATCH[1]}
  return 0
}
# ours RUN [flags...]: the processor on the run's streams, stopped (SIGTERM: it finishes its
# batches) once its stats file counts every record the streams stored, then checked against the
# model. Not --exit-on-eof: with it a pull expires after 250 ms, and a stream whose two batches
# are released slower than that (per-message: a few hundred records a second per stream) waited
# ~10 s for a pull's answer that never came, every 2,000 records (nats-server 2.9.10), which
# measured the stall, not the mode.
ours() {
  local run=$1 db="${PREFIX}nats_$1" stored processor
  shift
  db=${db//-/_}
  publish "$run"
  stored=$(stored "$run")
  fresh_database "$db"
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" $bin migrate >/dev/null
  mapfile -t s < <(streams "$run")
  log "$run: batch-inbox run $*"
  $bench cpu run --out "$work/cpu.json" "${cpu[@]}" -- \
    env DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" RUST_LOG=warn \
    $bin run --source "$NATS_URL" "${s[@]}" --consumer batch-inbox --batch-size "$BATCH_SIZE" \
    --log-interval 0 --stats-file "$work/$run.stats.json" --stats-interval 100ms "$@" >&2 &
  run_pid=$!
  while kill -0 "$run_pid" 2>/dev/null; do
    committed "$work/$run.stats.json"
    [ "$COMMITTED" -ge "$stored" ] && break
    sleep 0.1
  done
  # The processor is the child of `cpu run` (env execs it).
  processor=$(pgrep -P "$run_pid" || true)
  [ -n "$processor" ] && kill -TERM "$processor"
  wait "$run_pid" || { run_pid=""; log "$run: the processor failed"; exit 1; }
  run_pid=""
  committed "$work/$run.stats.json"
  [ "$COMMITTED" -ge "$stored" ] ||
    { log "$run: the processor ended before it committed the $stored records stored"; exit 1; }
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" $bench verify --expect "$work/$run.expect.json" >&2
  row "$run" "$(rate_of "$work/$run.stats.json")" "$work/cpu.json" "${*:-defaults}; checked against the model"
}
# The batched run right after the floor, the long per-message run last: the two runs the ratio
# compares see the machine as alike as can be.
ours batched
ours per-message --mode per-message

cp "$work/rows.jsonl" "$OUT/rows.jsonl"
python3 - "$work/rows.jsonl" "$OUT/results.md" "$MESSAGES" "$STREAMS" "$version" \
  "${MACHINE_NOTE:-other work on the machine during the measurement not stated}" \
  "$(uptime | sed 's/.*load average: //')" "$BATCH_SIZE" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out, n, streams, version, note, load, batch = sys.argv[2:10]
by = {r["run"]: r for r in rows}
plural = "s" if streams != "1" else ""
verb = "keep" if plural else "keeps"
stored = sorted({r["records"] for r in rows})
stored_s = " to ".join(f"{x:,}" for x in (stored[0], stored[-1])) if len(stored) > 1 else f"{stored[0]:,}"
lines = [
  "# batch-inbox on NATS JetStream: the server's floor, the per-message baseline and the batched default",
  "",
  f"Written by `scripts/nats/compare.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC: nats-server {version} (Debian's package, one server, JetStream file store), PostgreSQL on the same host, **{note}** (load average at the end: {load}).",
  "",
  f"Input: {int(n):,} generated ledger entries (10% duplicates, 1% bad input), published with their id in `Nats-Msg-Id` and each publish acknowledged, to {streams} stream{plural} (file storage, each account's records to one stream), once per run into streams of the run's own. The streams keep JetStream's default duplicate window (2 minutes) and drop a publish whose id they saw within it, so the re-sent records and the bad ones sharing an id never reach a reader: the streams stored {stored_s} records, and rates and CPU are per stored record. msgs/s: from the first delivery to the last acknowledgement flushed (floor) or COMMIT (ours: the stats file's window). Ours are stopped (SIGTERM) once their stats file counts every stored record, not by `--exit-on-eof`: its pulls expire after 250 ms, and nats-server 2.9.10 left such a pull unanswered while a per-message stream released its two batches, so each stream waited ~10 s after every 2,000 records (1,290 msgs/s, the stall measured, not the mode). CPU in ms per 1000 stored records over the run's process lifetime: the process, the server (nats-server), PostgreSQL (every backend), the whole machine ({rows[0]['cores']} cores).",
  "",
  "| run | records | msgs/s | CPU: process · server · PostgreSQL · machine | cores in use: the run's · other work | note |",
  "| --- | ---: | ---: | ---: | ---: | --- |",
]
# The run's three (the process, nats-server, PostgreSQL): their CPU per record.
ours_k = lambda r: sum(r["cpu_ms_per_1k"][k] for k in ("process", "server", "postgres"))
# Cores the run's three kept busy while records flowed: their CPU over the measured window (the
# records over msgs/s). An upper bound: CPU spent outside the window (start, end) counts in.
in_use = lambda r: ours_k(r) * r["msgs_per_s"] / 1e6
# Cores other work on the machine took, on average over the run's process lifetime.
other = lambda r: max(r["cpu_s"]["machine"] - sum(r["cpu_s"][k] for k in ("process", "server", "postgres")), 0.0) / max(r["wall_s"], 1e-9)
for r in rows:
    c = r["cpu_ms_per_1k"]
    lines.append(f"| {r['run']} | {r['records']:,} | {r['msgs_per_s']:,} | {c['process']} · {c['server']} · {c['postgres']} · {c['machine']} | {in_use(r):.2f} · {other(r):.2f} of {r['cores']} | {r['note']} |")
lines += ["", "Cores in use: the run's = the CPU per record of the process, nats-server and PostgreSQL times msgs/s, the cores they kept busy while records flowed (an upper bound: what they spent before the first record and after the last counts in); other work = the machine's CPU that was not theirs, averaged over the process's lifetime."]
if {"floor", "batched", "per-message"} <= by.keys():
    b, f, p = by["batched"], by["floor"], by["per-message"]
    ratio = b["msgs_per_s"] / f["msgs_per_s"]
    lines += ["", f"Batched: **{ratio:.0%} of the server's floor**, **{b['msgs_per_s'] / p['msgs_per_s']:.1f}× the per-message baseline**."]
    if ratio < 0.8:
        bc, fc, cores = b["cpu_ms_per_1k"], f["cpu_ms_per_1k"], b["cores"]
        serial = f"Within each stream the transactions are serial (a batch commits after the one before, in the stream's order), so {streams} stream{plural} {verb} at most {streams} transaction{plural} in flight"
        lines += ["", f"Why batched stays under 80% of the floor: the floor only reads and acknowledges, {ours_k(f):.1f} ms of CPU per 1000 records ({fc['process']} in the reader, {fc['server']} in nats-server); batched also decodes, inserts and commits every record, {ours_k(b):.1f} ms per 1000 ({bc['process']} in the processor, {bc['server']} in nats-server, {bc['postgres']} in PostgreSQL), {ours_k(b) / max(ours_k(f), 1e-9):.1f}× the floor's, and the server, the processor and PostgreSQL share {cores} cores."]
        if in_use(b) + other(b) >= 0.85 * cores:
            bound = "Both are" if in_use(f) + other(f) >= 0.85 * cores else "Batched is"
            lines.append(f"{bound} bound by the CPU: the run's three kept {in_use(f):.2f} (floor) and {in_use(b):.2f} (batched) of {cores} cores busy, other work {other(f):.2f} and {other(b):.2f}, so the rates stand about in the inverse ratio of the CPU per record ({ours_k(f) / max(ours_k(b), 1e-9):.0%} of the floor predicted, {ratio:.0%} measured). {serial}, each waiting on PostgreSQL on the same cores: on this machine more streams would not raise the rate.")
            if other(b) >= 0.25:
                lines.append(f"Other work took {other(b):.2f} cores during the batched run: on a quiet machine its rate would be higher.")
        else:
            lines.append(f"The CPU does not bound it: the run's three kept {in_use(b):.2f} of {cores} cores busy (other work {other(b):.2f}). The bound is the serial transactions. {serial}, and each stream waits for its COMMIT before its next batch is applied.")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
