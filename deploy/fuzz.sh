#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang in their own build dir and
# runs each for a bounded time from its checked-in seed corpus. A crash, a leak
# or a hang fails the run and prints the reproducer (path and base64).
# Usage: deploy/fuzz.sh [SECONDS_PER_TARGET (default 30)] [TARGET...]
#   Longer: deploy/fuzz.sh 3600 bundle_fuzz   (new inputs go to build-fuzz/corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
shift || true
BUILD_DIR=${SILT_FUZZ_BUILD_DIR:-build-fuzz}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(openfaas_json_fuzz bundle_fuzz stack_yml_fuzz snapshot_manifest_fuzz
  gateway_http_fuzz async_record_fuzz worker_frames_fuzz restore_plan_fuzz call_wire_fuzz
  image_archive_fuzz gpu_proclet_fuzz)
command -v clang++ >/dev/null || { echo "fuzz: clang++ is missing: run deploy/setup.sh" >&2; exit 1; }

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DSILT_FUZZ=ON -DSILT_BUILD_TESTS=OFF -DSILT_WITH_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" -j 2 --target "${TARGETS[@]}"

failed=0
for t in "${TARGETS[@]}"; do
  seeds="tests/fuzz/corpus/${t%_fuzz}"
  corpus="$BUILD_DIR/corpus/${t%_fuzz}"
  crashes="$BUILD_DIR/crashes"
  mkdir -p "$corpus" "$crashes"
  log="$BUILD_DIR/$t.log"
  if "$BUILD_DIR/tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/$t-" \
      "$corpus" "$seeds" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $t: ${runs} executions in ${SECONDS_EACH}s, no crash"
    echo "fuzz_executions_${t%_fuzz}=${runs}"
  else
    failed=1
    echo "fuzz: $t FAILED; the last lines of $log:" >&2
    tail -n 40 "$log" >&2
    for f in "$crashes/$t-"*; do
      [ -e "$f" ] || continue
      echo "fuzz: reproducer $f (run: $BUILD_DIR/tests/fuzz/$t $f); base64:" >&2
      base64 -w0 "$f" >&2
      echo >&2
    done
  fi
done
exit $failed
