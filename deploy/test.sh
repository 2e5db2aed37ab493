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
