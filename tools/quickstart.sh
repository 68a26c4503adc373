#!/usr/bin/env bash
# Runs tutti end to end on one machine: a small synthetic dataset, its index,
# one tutti-packerd, two tutti-stagerd ("nodes" 0 and 1, each with its own
# cache directory) and 4 training ranks under mpirun that pull their batches
# step by step and run the plan's all-to-all with every byte checked. Prints
# the per-step table and what the daemons' /metrics say, then shuts
# everything down. Exit status 0 when every part worked.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
WORK_DIR=""
STEPS=20
SAMPLES=320
MAX_MEGAPIXELS=1
SEED=1
KEEP_RUNNING=0
FRESH=0
RUN_TIMEOUT=300
READY_TIMEOUT=60

usage() {
  cat <<EOF
usage: tools/quickstart.sh [options]

Runs tutti end to end on this machine: generates a small synthetic WebDataset,
indexes it, starts one tutti-packerd and two tutti-stagerd (two "nodes" with
separate cache directories, on loopback ports the OS picks), runs 4 ranks of
tutti-rank-demo under mpirun that pull every step's batch and run the plan's
all-to-all (post-balancing on, so encoder outputs cross ranks and nodes) with
every byte verified, prints a per-step table and a metrics summary, and shuts
everything down. Takes about a minute; generating the dataset takes most of it,
and a dataset made with the same options is reused.

options:
  --work-dir DIR        where the dataset, index, job config, caches and logs go
                        (default: BUILD_DIR/quickstart)
  --build-dir DIR       the build tree holding the binaries (default: \$BUILD_DIR,
                        else build/)
  --steps N             training steps the ranks pull (default: $STEPS)
  --samples N           samples in the generated dataset (default: $SAMPLES)
  --max-megapixels X    largest generated image, in megapixels (default: $MAX_MEGAPIXELS)
  --seed N              dataset seed (default: $SEED)
  --fresh               regenerate the dataset and empty the caches first
  --keep-running        leave the packer and stagers up after the run, print how to
                        explore them (metrics, more ranks, plans, Python), and stop
                        them on Ctrl-C
  --timeout S           give up on the ranks after S seconds (default: $RUN_TIMEOUT)
  -h, --help            this text

Files in the work dir: dataset/ (shards), index.tutti, job.textproto,
cache0/ cache1/ (the stagers' node-local caches), logs/ (every process's
output), run/ (port files).
EOF
}

die_usage() { echo "quickstart: $*; see --help" >&2; exit 2; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die_usage "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --work-dir) need_value "$@"; WORK_DIR="$2"; shift 2 ;;
    --build-dir) need_value "$@"; BUILD_DIR="$2"; shift 2 ;;
    --steps) need_value "$@"; STEPS="$2"; shift 2 ;;
    --samples) need_value "$@"; SAMPLES="$2"; shift 2 ;;
    --max-megapixels) need_value "$@"; MAX_MEGAPIXELS="$2"; shift 2 ;;
    --seed) need_value "$@"; SEED="$2"; shift 2 ;;
    --timeout) need_value "$@"; RUN_TIMEOUT="$2"; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --keep-running) KEEP_RUNNING=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
done
for v in STEPS SAMPLES SEED RUN_TIMEOUT; do
  [[ "${!v}" =~ ^[0-9]+$ ]] && [ "${!v}" -gt 0 ] ||
    die_usage "--$(echo "$v" | tr 'A-Z_' 'a-z-') must be a positive integer, got '${!v}'"
done
[[ "$MAX_MEGAPIXELS" =~ ^[0-9]*\.?[0-9]+$ ]] ||
  die_usage "--max-megapixels must be a number, got '$MAX_MEGAPIXELS'"

[ -d "$BUILD_DIR" ] ||
  { echo "quickstart: build directory '$BUILD_DIR' does not exist; build first (tools/setup.sh)" >&2; exit 1; }
BUILD_DIR="$(cd "$BUILD_DIR" && pwd)"
WORK_DIR="${WORK_DIR:-$BUILD_DIR/quickstart}"
TUTTI="$BUILD_DIR/tools/tutti"
PACKERD="$BUILD_DIR/services/packer/tutti-packerd"
STAGERD="$BUILD_DIR/services/stager/tutti-stagerd"
RANK_DEMO="$BUILD_DIR/client/tutti-rank-demo"
NODES=2
RANKS=4

# ---------------------------------------------------------------- helpers --
PHASE="start"
LOG_HINT=""          # the log to show when the current phase fails
declare -A PIDS=()   # name -> pid of every daemon started here
declare -A LOGS=()   # name -> its log file
CLEAN_EXIT=0

say() { printf '==> %s\n' "$*"; }

tail_log() {
  local f="$1"
  if [ -s "$f" ]; then
    echo "---- last lines of $f ----" >&2
    tail -n 25 "$f" >&2
    echo "----" >&2
  fi
}

fail() {
  echo "quickstart: FAILED while $PHASE: $*" >&2
  [ -n "$LOG_HINT" ] && tail_log "$LOG_HINT"
  exit 1
}

# Stops what this script started: SIGTERM, a bounded wait, then SIGKILL.
kill_all() {
  local name pid
  for name in "${!PIDS[@]}"; do kill -TERM "${PIDS[$name]}" 2>/dev/null || true; done
  for _ in $(seq 100); do
    local alive=0
    for name in "${!PIDS[@]}"; do kill -0 "${PIDS[$name]}" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for name in "${!PIDS[@]}"; do
    pid="${PIDS[$name]}"
    if kill -0 "$pid" 2>/dev/null; then
      echo "quickstart: $name (pid $pid) ignored SIGTERM; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}

on_exit() {
  local rc=$?
  # Whatever happens to the output from here on, stop the daemons.
  set +e
  trap '' PIPE HUP INT TERM
  if [ "$CLEAN_EXIT" != 1 ]; then
    [ "$rc" = 0 ] && rc=1
    if ((${#PIDS[@]})); then
      echo "quickstart: stopping the daemons it started" >&2
      kill_all
    fi
    if [ -d "$WORK_DIR/logs" ]; then echo "quickstart: failed (logs in $WORK_DIR/logs)" >&2; fi
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'PHASE="interrupted"; echo "quickstart: interrupted" >&2; exit 130' INT TERM
# A closed output (e.g. piped into head) or a closed terminal still stops the daemons.
trap 'exit 129' HUP
trap 'exit 141' PIPE

# Starts a daemon in the background: start_daemon NAME LOG CMD...
start_daemon() {
  local name="$1" log="$2"
  shift 2
  "$@" >"$log" 2>&1 &
  PIDS[$name]=$!
  LOGS[$name]="$log"
}

# Waits until NAME has written its port file (grpc=PORT, metrics=PORT), or
# fails when it exits or takes longer than READY_TIMEOUT seconds.
wait_ready() {
  local name="$1" file="$2" pid="${PIDS[$1]}" deadline=$((SECONDS + READY_TIMEOUT))
  LOG_HINT="${LOGS[$name]}"
  while :; do
    if [ -s "$file" ] && grep -q '^grpc=[0-9]' "$file" && grep -q '^metrics=[0-9]' "$file"; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      local rc=0
      wait "$pid" || rc=$?
      unset "PIDS[$name]"
      fail "$name exited with status $rc before it was ready"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      fail "$name was not ready after ${READY_TIMEOUT}s (no port file $file)"
    fi
    sleep 0.1
  done
}

port_of() { sed -n "s/^$2=//p" "$1"; }

# GET http://127.0.0.1:PORT/metrics
fetch_metrics() {
  if command -v curl >/dev/null; then
    curl -fsS --max-time 5 "http://127.0.0.1:$1/metrics"
  else
    exec 3<>"/dev/tcp/127.0.0.1/$1"
    printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
    sed '1,/^\r$/d' <&3
    exec 3<&-
  fi
}

# The value of one sample line: metric NAME[{labels}] from a scrape in $1.
metric() { awk -v m="$2" '$1 == m { print $2; exit }' <<<"$1"; }
# Sum over every label set of NAME.
metric_sum() { awk -v m="$2" 'index($1, m "{") == 1 || $1 == m { s += $2 } END { print s + 0 }' <<<"$1"; }
human_bytes() {
  awk -v b="${1:-0}" 'BEGIN { split("B KiB MiB GiB TiB", u, " "); i = 1;
    while (b >= 1024 && i < 5) { b /= 1024; i++ } printf (i == 1 ? "%d %s" : "%.1f %s"), b, u[i] }'
}
ratio_ms() {
  awk -v s="${1:-0}" -v c="${2:-0}" 'BEGIN { if (c <= 0) print "n/a";
    else if (s / c < 1e-3) printf "%.1f us", s / c * 1e6; else printf "%.2f ms", s / c * 1e3 }'
}

# Stops NAME with SIGTERM and checks that it exits 0 within 20 s.
stop_daemon() {
  local name="$1" pid="${PIDS[$1]}" rc=0
  LOG_HINT="${LOGS[$name]}"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "PIDS[$name]"
    fail "$name did not exit within 20 s of SIGTERM"
  fi
  wait "$pid" || rc=$?
  unset "PIDS[$name]"
  [ "$rc" = 0 ] || fail "$name exited with status $rc after SIGTERM"
}

# ------------------------------------------------------------ preconditions --
PHASE="checking the build"
for b in "$TUTTI" "$PACKERD" "$STAGERD" "$RANK_DEMO"; do
  [ -x "$b" ] || fail "$b is missing; build first: tools/setup.sh --no-quickstart (or ninja -C $BUILD_DIR)"
done
command -v mpirun >/dev/null || fail "mpirun is not installed (Debian: apt-get install openmpi-bin)"
if [ "$(id -u)" = 0 ]; then
  # Open MPI refuses to run as root unless told it is intended.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mkdir -p "$WORK_DIR" 2>/dev/null || fail "cannot create the work directory $WORK_DIR (--work-dir)"
WORK_DIR="$(cd "$WORK_DIR" && pwd)"
[ -w "$WORK_DIR" ] || fail "the work directory $WORK_DIR is not writable (--work-dir)"
LOG_DIR="$WORK_DIR/logs"
RUN_DIR="$WORK_DIR/run"
mkdir -p "$LOG_DIR" "$RUN_DIR"
rm -f "$RUN_DIR"/*.ports
START=$SECONDS

# ---------------------------------------------------------------- dataset --
PHASE="generating the dataset"
DATASET="$WORK_DIR/dataset"
GEN_ARGS=(--samples "$SAMPLES" --samples-per-shard 64 --max-megapixels "$MAX_MEGAPIXELS"
          --large-fraction 0 --text-tokens-median 200 --seed "$SEED")
STAMP="$WORK_DIR/dataset.options"
if [ "$FRESH" = 1 ]; then
  rm -rf "$DATASET" "$STAMP" "$WORK_DIR"/cache*
fi
if [ -d "$DATASET" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${GEN_ARGS[*]}" ]; then
  say "reusing the dataset in $DATASET (same options; --fresh makes a new one)"
else
  say "generating $SAMPLES samples into $DATASET"
  rm -rf "$DATASET" "$DATASET.partial" "$STAMP" "$WORK_DIR"/cache*
  LOG_HINT="$LOG_DIR/gen-dataset.log"
  "$TUTTI" gen-dataset --out "$DATASET.partial" "${GEN_ARGS[@]}" --quiet >"$LOG_HINT" 2>&1 ||
    fail "tutti gen-dataset exited with status $?"
  mv "$DATASET.partial" "$DATASET"
  sed -e 's/^/    /' -e "s|$DATASET.partial|$DATASET|" "$LOG_HINT"
  echo "${GEN_ARGS[*]}" >"$STAMP"
fi

PHASE="indexing the dataset"
LOG_HINT="$LOG_DIR/index.log"
INDEX="$WORK_DIR/index.tutti"
"$TUTTI" index --source "$DATASET" --out "$INDEX" >"$LOG_HINT" 2>&1 ||
  fail "tutti index exited with status $?"
sed 's/^/    /' "$LOG_HINT"

# ------------------------------------------------------------- job config --
PHASE="writing the job config"
LOG_HINT=""
JOB="$WORK_DIR/job.textproto"
EXAMPLE="$ROOT/deploy/examples/job.textproto"
[ -f "$EXAMPLE" ] || fail "$EXAMPLE is missing"
grep -q '^index_path:' "$EXAMPLE" || fail "$EXAMPLE has no index_path line to point at $INDEX"
{
  echo "# Written by tools/quickstart.sh from deploy/examples/job.textproto."
  # The stagers name their shared-memory batches after the job id: one per
  # user, so that two users' quick-starts on one machine stay apart.
  sed -e "s|^index_path:.*|index_path: \"$INDEX\"|" \
      -e "s|^job_id: *\"\([^\"]*\)\".*|job_id: \"\1-$(id -un | tr -c 'A-Za-z0-9_\n-' '_')\"|" "$EXAMPLE"
  if ! grep -q '^post_balancing' "$EXAMPLE"; then
    echo
    echo "# Post-balancing: every image is encoded on the least-loaded rank and its"
    echo "# encoder output travels to the rank whose LLM sequence holds the sample."
    echo "post_balancing { enabled: true }"
  fi
} >"$JOB"
WORLD=$(sed -n 's/^world_size: *\([0-9]*\).*/\1/p' "$JOB")
PER_NODE=$(sed -n 's/^ranks_per_node: *\([0-9]*\).*/\1/p' "$JOB")
[ "$WORLD" = "$RANKS" ] && [ "$PER_NODE" = $((RANKS / NODES)) ] ||
  fail "$EXAMPLE plans world_size $WORLD with ranks_per_node $PER_NODE; the quick-start runs $RANKS ranks on $NODES nodes"
say "job config $JOB ($RANKS ranks, $NODES nodes, post-balancing on)"

# --------------------------------------------------------------- daemons --
PHASE="starting tutti-packerd"
start_daemon packer "$LOG_DIR/packer.log" "$PACKERD" --config "$JOB" --listen 127.0.0.1:0 \
  --metrics 127.0.0.1:0 --port_file "$RUN_DIR/packer.ports"
wait_ready packer "$RUN_DIR/packer.ports"
PACKER_PORT=$(port_of "$RUN_DIR/packer.ports" grpc)
PACKER_METRICS=$(port_of "$RUN_DIR/packer.ports" metrics)
say "tutti-packerd on 127.0.0.1:$PACKER_PORT (metrics :$PACKER_METRICS, pid ${PIDS[packer]})"

# The stagers register their staging buffers with io_uring, which counts
# against the user's locked-memory limit (ulimit -l; root is exempt). Under a
# limit, size the buffers so that both stagers fit in half of it.
STAGING_FLAGS=()
MEMLOCK_KIB=$(ulimit -l)
if [ "$(id -u)" != 0 ] && [ "$MEMLOCK_KIB" != unlimited ] && [ "$MEMLOCK_KIB" -lt $((2 * 64 * 1024 * 2)) ]; then
  DEPTH=$((MEMLOCK_KIB / 2 / NODES / 256))
  [ "$DEPTH" -ge 1 ] || fail "the locked-memory limit (ulimit -l) is only $MEMLOCK_KIB KiB; the stagers need at least $((2 * NODES * 256)) KiB for their io_uring buffers (raise it in /etc/security/limits.conf)"
  [ "$DEPTH" -le 64 ] || DEPTH=64
  STAGING_FLAGS=(--queue_depth "$DEPTH" --block_size 256K)
  say "locked-memory limit $MEMLOCK_KIB KiB: each stager stages with $DEPTH x 256 KiB io_uring buffers"
fi
STAGERS=""
declare -A STAGER_METRICS=()
for node in $(seq 0 $((NODES - 1))); do
  PHASE="starting tutti-stagerd for node $node"
  start_daemon "stager$node" "$LOG_DIR/stager$node.log" "$STAGERD" \
    --packer "127.0.0.1:$PACKER_PORT" --node "$node" --source "$DATASET" \
    --cache "$WORK_DIR/cache$node" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 \
    --port_file "$RUN_DIR/stager$node.ports" --memory_budget 1G --packer_wait_s 30 \
    "${STAGING_FLAGS[@]}"
done
for node in $(seq 0 $((NODES - 1))); do
  PHASE="starting tutti-stagerd for node $node"
  wait_ready "stager$node" "$RUN_DIR/stager$node.ports"
  port=$(port_of "$RUN_DIR/stager$node.ports" grpc)
  STAGER_METRICS[$node]=$(port_of "$RUN_DIR/stager$node.ports" metrics)
  STAGERS="${STAGERS:+$STAGERS,}127.0.0.1:$port"
  say "tutti-stagerd node $node on 127.0.0.1:$port (metrics :${STAGER_METRICS[$node]}, cache $WORK_DIR/cache$node, pid ${PIDS[stager$node]})"
done

# ----------------------------------------------------------------- ranks --
PHASE="running $RANKS ranks under mpirun"
say "mpirun -np $RANKS tutti-rank-demo: $STEPS steps, ranks 0-$((RANKS / NODES - 1)) on node 0, the rest on node 1"
cat <<'EOF'
    one row per rank and step: wait_ms = time Next() waited for the batch; images, patches =
    the rank's vision-encoder work; tokens, seqs = its packed LLM sequences; skipped = samples
    the stager replaced; send/recv_KiB = encoder outputs the plan's all-to-all moves;
    xchg_ms = forward + backward exchange (every byte checked on arrival)
EOF
RANK_OUT="$LOG_DIR/ranks.out"
RANK_ERR="$LOG_DIR/ranks.err"
LOG_HINT="$RANK_ERR"
echo
# The ranks' table streams to the terminal and to ranks.out; mpirun runs in
# the background so that Ctrl-C is handled at once (the trap stops it too).
exec {TABLE_FD}> >(tee "$RANK_OUT")
TEE_PID=$!
timeout --kill-after=10 "$RUN_TIMEOUT" mpirun -np "$RANKS" --oversubscribe "$RANK_DEMO" \
  --stager "$STAGERS" --packer "127.0.0.1:$PACKER_PORT" --steps "$STEPS" \
  --connect_timeout_s 30 --batch_timeout_s 120 --join_timeout_s 120 \
  1>&"$TABLE_FD" 2>"$RANK_ERR" </dev/null &
PIDS[ranks]=$!
LOGS[ranks]="$RANK_ERR"
rc=0
wait "${PIDS[ranks]}" || rc=$?
unset "PIDS[ranks]"
exec {TABLE_FD}>&-
wait "$TEE_PID" 2>/dev/null || true
echo
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  fail "the ranks did not finish within ${RUN_TIMEOUT}s (--timeout)"
elif [ "$rc" != 0 ]; then
  fail "mpirun exited with status $rc"
fi
for name in "${!PIDS[@]}"; do
  kill -0 "${PIDS[$name]}" 2>/dev/null || { LOG_HINT="${LOGS[$name]}"; fail "$name died during the run"; }
done

# --------------------------------------------------------------- metrics --
PHASE="reading /metrics"
LOG_HINT=""
m=$(fetch_metrics "$PACKER_METRICS") || fail "no /metrics from tutti-packerd on :$PACKER_METRICS"
say "metrics"
printf '  %-24s %s\n' "tutti-packerd" "http://127.0.0.1:$PACKER_METRICS/metrics"
printf '    %-34s %s\n' \
  "steps planned (ahead of the ranks)" "$(metric "$m" tutti_packer_steps_planned_total)" \
  "mean plan time" "$(ratio_ms "$(metric "$m" tutti_packer_plan_seconds_sum)" "$(metric "$m" tutti_packer_plan_seconds_count)")" \
  "inter-node exchange per step" "$(human_bytes "$(awk -v s="$(metric "$m" tutti_packer_exchange_inter_node_bytes_sum)" -v c="$(metric "$m" tutti_packer_exchange_inter_node_bytes_count)" 'BEGIN { if (c > 0) printf "%d", s / c; else print 0 }')")" \
  "step timings reported by ranks" "$(metric "$m" 'tutti_packer_timing_reports_total{result="accepted"}')" \
  "mean batch wait, as ranks report" "$(ratio_ms "$(metric "$m" 'tutti_packer_reported_phase_seconds_sum{phase="data_wait"}')" "$(metric "$m" 'tutti_packer_reported_phase_seconds_count{phase="data_wait"}')")" \
  "mean exchange, as ranks report" "$(ratio_ms "$(metric "$m" 'tutti_packer_reported_phase_seconds_sum{phase="exchange"}')" "$(metric "$m" 'tutti_packer_reported_phase_seconds_count{phase="exchange"}')")"
for node in $(seq 0 $((NODES - 1))); do
  port=${STAGER_METRICS[$node]}
  m=$(fetch_metrics "$port") || fail "no /metrics from tutti-stagerd node $node on :$port"
  printf '  %-24s %s\n' "tutti-stagerd node $node" "http://127.0.0.1:$port/metrics"
  printf '    %-34s %s\n' \
    "staged into the cache" "$(metric "$m" tutti_stager_staged_files_total) shards, $(human_bytes "$(metric "$m" tutti_stager_staged_bytes_total)")" \
    "cache hits / misses" "$(metric "$m" tutti_stager_cache_hits_total) / $(metric "$m" tutti_stager_cache_misses_total)" \
    "images decoded" "$(metric "$m" tutti_stager_decoded_images_total)" \
    "batches built" "$(metric "$m" tutti_stager_batches_built_total)" \
    "samples skipped" "$(metric_sum "$m" tutti_stager_skipped_samples_total)" \
    "mean batch wait, in the stager" "$(ratio_ms "$(metric "$m" tutti_stager_client_wait_seconds_sum)" "$(metric "$m" tutti_stager_client_wait_seconds_count)")"
done

# ------------------------------------------------------------ exploration --
if [ "$KEEP_RUNNING" = 1 ]; then
  trap 'PHASE="stopping"; echo; say "stopping"' INT TERM
  STAGER_METRICS_LIST=$(for node in $(seq 0 $((NODES - 1))); do printf '%s ' "${STAGER_METRICS[$node]}"; done)
  PYTHON=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null)
  cat <<EOF

The packer and stagers keep running (Ctrl-C stops them). Things to try:
  # every metric of the packer (the stagers': ports $STAGER_METRICS_LIST)
  curl -s http://127.0.0.1:$PACKER_METRICS/metrics | grep ^tutti_
  # the plan of the next step, per rank
  $TUTTI plan --config $JOB --step $STEPS
  # 10 more steps (each step is handed to each rank once: continue where the last run stopped)
  mpirun -np $RANKS --oversubscribe $RANK_DEMO --stager $STAGERS --packer 127.0.0.1:$PACKER_PORT --start_step $STEPS --steps 10
  # then one rank from Python
  PYTHONPATH=$BUILD_DIR/python ${PYTHON:-python3} -c 'import tutti; c = tutti.Client(stager="${STAGERS%%,*}", packer="127.0.0.1:$PACKER_PORT", rank=0, world_size=$RANKS, start_step=$((STEPS + 10))); b = c.next(); print(b.step, b.pixel_values.shape, b.input_ids.shape)'
Logs: $LOG_DIR
EOF
  while :; do
    for name in "${!PIDS[@]}"; do
      kill -0 "${PIDS[$name]}" 2>/dev/null || { LOG_HINT="${LOGS[$name]}"; PHASE="exploring"; fail "$name exited"; }
    done
    sleep 1 || true
    [ "$PHASE" = "stopping" ] && break
  done
fi

# -------------------------------------------------------------- shutdown --
for node in $(seq 0 $((NODES - 1))); do
  PHASE="stopping tutti-stagerd node $node"
  stop_daemon "stager$node"
done
PHASE="stopping tutti-packerd"
stop_daemon packer
say "stopped the packer and both stagers cleanly (exit status 0); logs in $LOG_DIR"
say "quick-start finished in $((SECONDS - START)) s"
CLEAN_EXIT=1
