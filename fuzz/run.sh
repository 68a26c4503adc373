#!/usr/bin/env bash
# Runs the libFuzzer targets of a TUTTI_FUZZ build for a bounded time each.
#   fuzz/run.sh <build-dir> [seconds-per-target (default 60)] [target ...]
# Each target starts from its seed corpus and regression inputs (read only);
# what it finds goes to a scratch corpus under <build-dir>/fuzz/work. A
# crash, sanitizer report, leak, out-of-memory or an input running over 10 s
# stops the target with its input in <build-dir>/fuzz/artifacts/ and makes
# the script fail. One line per target goes to <build-dir>/fuzz/results.txt.
set -uo pipefail
BUILD_DIR="$(cd "$1" && pwd)"
SECONDS_EACH="${2:-60}"
shift $(($# >= 2 ? 2 : 1))
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in "$HERE"/*_fuzzer.cc; do targets+=("$(basename "$f" .cc)"); done
fi
OUT="$BUILD_DIR/fuzz"
mkdir -p "$OUT/artifacts" "$OUT/work"
: >"$OUT/results.txt"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
printf '%-22s %8s %12s %8s %8s %8s\n' target seconds executions cov ft corpus | tee -a "$OUT/results.txt"
for t in "${targets[@]}"; do
  bin="$OUT/$t"
  if [ ! -x "$bin" ]; then
    echo "$t: no $bin (configure with -DTUTTI_FUZZ=ON and build it)" >&2
    failed+=("$t")
    continue
  fi
  work="$OUT/work/$t"
  rm -rf "$work"
  mkdir -p "$work"
  inputs=("$HERE/corpus/$t")
  [ -d "$HERE/regressions/$t" ] && inputs+=("$HERE/regressions/$t")
  log="$OUT/$t.log"
  "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2560 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t-" "$work" "${inputs[@]}" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  printf '%-22s %8s %12s %8s %8s %8s%s\n' "$t" "$SECONDS_EACH" "${execs:-?}" "${cov:-?}" \
    "${ft:-?}" "${corp:-?}" "$( ((rc)) && echo "  FAILED (rc $rc, see $log)")" |
    tee -a "$OUT/results.txt"
  if ((rc)); then
    failed+=("$t")
    grep -v '^\[libprotobuf' "$log" | grep -E 'ERROR|runtime error|SUMMARY|Test unit written|timeout' | head -5 >&2
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
