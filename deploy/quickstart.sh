#!/usr/bin/env bash
# Sets up this machine, builds Silt, installs `silt` and `silt-gateway` into /usr/local/bin
# and runs the gateway on 127.0.0.1:8080 in the foreground (Ctrl-C stops it).
#   SILT_DATA_DIR  where the store and credentials live (default /var/lib/silt)
#   SILT_LISTEN    gateway address (default 127.0.0.1:8080)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SILT_BUILD_DIR:-build}
DATA_DIR=${SILT_DATA_DIR:-/var/lib/silt}
LISTEN=${SILT_LISTEN:-127.0.0.1:8080}
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
trap 'printf "\n\033[1;31m==> FAILED (exit %s) at: %s\033[0m\n" "$?" "$BASH_COMMAND" >&2' ERR
[ "$(id -u)" -eq 0 ] || { echo "run as root (set-up installs packages; the gateway keeps data in $DATA_DIR)" >&2; exit 1; }

step "set-up: installing dependencies (deploy/setup.sh)"
bash deploy/setup.sh

step "build ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j 2 --target silt silt-gateway
cmake --install "$BUILD_DIR" --prefix /usr/local >/dev/null
echo "installed /usr/local/bin/silt and /usr/local/bin/silt-gateway"

step "starting silt-gateway on $LISTEN (data in $DATA_DIR; Ctrl-C to stop)"
cat <<MSG
Then, in another shell:
  export OPENFAAS_URL=http://$LISTEN
  cat $DATA_DIR/secrets/basic-auth-password | silt login --password-stdin
  silt deploy --name hello --image hello:1 && silt list
MSG
exec /usr/local/bin/silt-gateway --listen "$LISTEN" --data-dir "$DATA_DIR"
