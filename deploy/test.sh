#!/usr/bin/env bash
# Sets up this machine (deploy/setup.sh), builds Silt and runs the whole test suite.
# Usage: deploy/test.sh [ctest args...]   (as root; e.g. deploy/test.sh -L unit)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SILT_BUILD_DIR:-build}
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
trap 'printf "\n\033[1;31m==> FAILED (exit %s) at: %s\033[0m\n" "$?" "$BASH_COMMAND" >&2' ERR

step "set-up: installing dependencies (deploy/setup.sh)"
if [ "$(id -u)" -eq 0 ]; then bash deploy/setup.sh; else sudo bash deploy/setup.sh; fi

step "configure ($BUILD_DIR, RelWithDebInfo)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSILT_BUILD_TESTS=ON

step "build (2 jobs)"
time cmake --build "$BUILD_DIR" -j 2

step "test (ctest)"
# Root-only tests (CRIU, namespaces, cgroups) run when this script runs as root, as in CI.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 --timeout 600 "$@"

# The parsers under libFuzzer (clang, ASan+UBSan), each for a bounded time from
# its seed corpus; a crash fails the run with its reproducer.
if [ $# -eq 0 ]; then
  step "fuzz (${SILT_FUZZ_SECONDS:-20} s per target)"
  bash deploy/fuzz.sh "${SILT_FUZZ_SECONDS:-20}"
fi

# The suite again with ASan+UBSan (build-asan/: daemons, libraries and tests
# instrumented; what runs inside a sandbox stays plain, see CMakeLists.txt). A
# finding stops the process that made it. Any report fails this step, also one
# from a daemon that a test spawned while the test itself passed: ASan writes
# its reports to build-asan/sanitizer/; GCC's UBSan runtime ignores log_path,
# so its reports are found in every test's output (daemons inherit the test's
# stderr), kept whole in build-asan/ctest.xml. LeakSanitizer checks every
# process that exits (daemons stopped with SIGTERM, the CLI, test binaries);
# those killed with SIGKILL are not checked. SILT_SANITIZE_RUN=0 skips it.
if [ $# -eq 0 ] && [ "${SILT_SANITIZE_RUN:-1}" != 0 ]; then
  step "sanitizers: ASan+UBSan build (build-asan) and ctest"
  # -O1 and line tables only: what ASan advises, and 40% less compile time.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DSILT_BUILD_TESTS=ON -DSILT_WITH_CUDA=OFF -DSILT_SANITIZER=address,undefined
  time cmake --build build-asan -j 2 --target silt_tests
  reports="$PWD/build-asan/sanitizer"
  rm -rf "$reports" && mkdir -p "$reports"
  opts="log_path=$reports/report:print_stacktrace=1:halt_on_error=1"
  # The rebalancer's tests assert what a node's cores measure under a CPU hog;
  # ASan's extra CPU per call moves those figures: they run in the plain build.
  ASAN_OPTIONS="$opts:detect_leaks=1" UBSAN_OPTIONS="$opts" \
    ctest --test-dir build-asan --output-on-failure -j 2 --timeout 900 \
    -E "${SILT_SANITIZE_EXCLUDE:-^RebalanceTest\.}" \
    --output-junit "$PWD/build-asan/ctest.xml" --test-output-size-passed 8000000 ||
    asan_failed=1
  # (A report file may hold only a warning, e.g. ASan's on stack switches.)
  pattern='runtime error:|ERROR: (Address|Leak|UndefinedBehavior)Sanitizer'
  found=$(grep -lE "$pattern" "$reports"/report.* 2>/dev/null || true)
  if [ -n "$found" ] || grep -Eq "$pattern" build-asan/ctest.xml; then
    for r in $found; do printf '\n==> %s\n' "$r" >&2; cat "$r" >&2; done
    grep -E -A 12 "$pattern" build-asan/ctest.xml >&2 || true
    echo "sanitizers: findings above" >&2
    exit 1
  fi
  [ -z "${asan_failed:-}" ] || exit 1
fi
