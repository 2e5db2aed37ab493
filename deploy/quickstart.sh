#!/usr/bin/env bash
# Sets up this machine, builds Silt, installs it into /usr/local, starts a gateway and an
# invoker (`silt local`) on 127.0.0.1:8080, deploys the examples, calls each one, and keeps
# running in the foreground (Ctrl-C stops everything).
#   SILT_DATA_DIR  where the store, bundles and credentials live (default /var/lib/silt)
#   SILT_LISTEN    gateway address (default 127.0.0.1:8080)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${SILT_BUILD_DIR:-build}
DATA_DIR=${SILT_DATA_DIR:-/var/lib/silt}
LISTEN=${SILT_LISTEN:-127.0.0.1:8080}
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
trap 'printf "\n\033[1;31m==> FAILED (exit %s) at: %s\033[0m\n" "$?" "$BASH_COMMAND" >&2' ERR
[ "$(id -u)" -eq 0 ] || { echo "run as root (set-up installs packages; instances run in namespaces and cgroups)" >&2; exit 1; }

step "set-up: installing dependencies (deploy/setup.sh)"
bash deploy/setup.sh

step "build ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j 2 --target silt silt-gateway silt-invoker silt-worker
cmake --install "$BUILD_DIR" --prefix /usr/local >/dev/null
echo "installed silt, silt-gateway, silt-invoker, silt-worker into /usr/local/bin and the SDK into /usr/local/include/silt"

step "starting silt local on $LISTEN (data in $DATA_DIR)"
mkdir -p "$DATA_DIR"
log=$(mktemp)
/usr/local/bin/silt local --data-dir "$DATA_DIR" --listen "$LISTEN" >"$log" 2>&1 &
local_pid=$!
trap 'kill -TERM $local_pid 2>/dev/null; wait $local_pid 2>/dev/null; exit 0' INT TERM
for _ in $(seq 600); do
  grep -q '^listening on' "$log" && break
  kill -0 $local_pid 2>/dev/null || { cat "$log"; echo "silt local exited" >&2; exit 1; }
  sleep 0.1
done
grep -q '^listening on' "$log" || { cat "$log"; echo "silt local did not come up" >&2; exit 1; }
cat "$log"

export OPENFAAS_URL=http://$LISTEN
silt login --password-stdin <"$DATA_DIR/gateway/secrets/basic-auth-password"

step "deploying the examples (silt up: build, push, deploy)"
work="$DATA_DIR/examples"
rm -rf "$work" && cp -r "$ROOT/examples" "$work"
for ex in hello lookup python python-http state; do
  silt up -f "$work/$ex/stack.yml"
done

step "calling each example (twice: the first call may boot an instance, the second is warm)"
call() {  # name body
  for i in 1 2; do
    out=$(curl -s -D "$work/headers" --data-binary "$2" "$OPENFAAS_URL/function/$1")
    tier=$(grep -i '^X-Silt-Start:' "$work/headers" | tr -d '\r' | cut -d' ' -f2)
    ms=$(grep -i '^X-Silt-Start-Ms:' "$work/headers" | tr -d '\r' | cut -d' ' -f2)
    printf '  %-10s [%s %s ms] %s\n' "$1" "$tier" "$ms" "$(echo "$out" | head -n1)"
  done
}
call hello "quickstart"
call primes "1000003"
call wordcount "the quick brown fox"
call greeter "quickstart"
curl -s -X PUT --data-binary "a lamp" "$OPENFAAS_URL/function/catalog?sku=42" >/dev/null
call catalog ""

cat <<MSG

Silt is running on $OPENFAAS_URL (Ctrl-C stops it). In another shell:
  export OPENFAAS_URL=$OPENFAAS_URL
  silt list
  silt new myfn --lang cpp && silt up
  curl -d 'hi' \$OPENFAAS_URL/function/myfn
MSG
wait $local_pid
