#!/usr/bin/env bash
# Installs everything Silt needs to build, test and run on Debian 12 (bookworm), as root.
# Idempotent: a second run checks what is there and takes seconds.
set -euo pipefail

# CRIU: the newest source >= CRIU_MIN in the first of CRIU_SUITES that has one, from this machine's
# Debian mirror; the pinned release is the fallback when none can be fetched (e.g. offline).
CRIU_MIN=4.1
CRIU_SUITES=(stable testing unstable)
CRIU_PINNED=4.1.1
CRIU_PINNED_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
CRIU_PREFIX=/usr/local
CACHE_DIR=${SILT_SETUP_CACHE:-/var/cache/silt-setup}
# Our fixes to CRIU (deploy/criu/*.patch, applied in name order before building). The marker
# holds the set's sha256sum listing: a CRIU built without exactly these patches is rebuilt.
CRIU_PATCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/criu
CRIU_PATCH_MARKER=$CRIU_PREFIX/share/silt/criu-patches

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs Debian packages and CRIU)"
. /etc/os-release
[ "${ID:-}" = debian ] && [ "${VERSION_ID:-}" = 12 ] ||
  log "warning: written for Debian 12, this is ${PRETTY_NAME:-unknown}"

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git clang-format ca-certificates curl
  # libraries
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libseccomp-dev libboost-dev nlohmann-json3-dev libyaml-cpp-dev
  libcli11-dev libspdlog-dev libfmt-dev libssl-dev zlib1g-dev
  # tests and benchmarks (clang and its runtimes: libFuzzer, ASan, UBSan)
  libgtest-dev libgmock-dev libbenchmark-dev nginx-light redis-server redis-tools
  clang libclang-rt-dev
  # runtimes
  containerd runc iproute2 busybox-static containernetworking-plugins
  # CRIU saves and restores network namespaces with iptables-save/-restore
  iptables
  # CRIU build dependencies
  libprotobuf-c-dev protobuf-c-compiler libnl-3-dev libnet1-dev libcap-dev libbsd-dev
  libaio-dev uuid-dev libnftables-dev libgnutls28-dev python3-protobuf xz-utils patch
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${#missing[@]} Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "all ${#PACKAGES[@]} Debian packages present"
fi
# nginx-light and redis-server are only benchmark baselines (the benchmarks start their own):
# keep the packaged services from holding :80 and :6379.
for svc in nginx redis-server; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active -q "$svc" 2>/dev/null; then
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
done

# Debian's criu 3.17 fails on current kernels (vDSO); Silt always names CRIU 4.1+ explicitly.
if dpkg-query -W -f='${Status}' criu 2>/dev/null | grep -q "install ok installed"; then
  log "removing Debian's criu 3.17 (broken on this kernel)"
  apt-get remove -y -q criu
fi

# CRIU: any release >= CRIU_MIN whose source Debian serves, built into CRIU_PREFIX. The suites are
# asked in this order and the first version found that downloads and verifies is built.
criu_version() { "$CRIU_PREFIX/sbin/criu" --version 2>/dev/null | awk '/^Version:/ { print $2 }'; }
criu_ok() {
  local v
  v=$(criu_version) && [ -n "$v" ] && dpkg --compare-versions "$v" ge "$CRIU_MIN" &&
    pkg-config --atleast-version="$CRIU_MIN" criu 2>/dev/null &&
    [ "$(cat "$CRIU_PATCH_MARKER" 2>/dev/null)" = "$(criu_patch_set)" ]
}

# The sha256sum listing of deploy/criu/*.patch in the order they are applied (empty if none).
criu_patch_set() {
  local p
  shopt -s nullglob
  p=("$CRIU_PATCH_DIR"/*.patch)
  shopt -u nullglob
  [ ${#p[@]} -eq 0 ] || (cd "$CRIU_PATCH_DIR" && sha256sum -- "${p[@]##*/}")
}

# Applies deploy/criu/*.patch to the CRIU source in $1. They are written against CRIU_PINNED:
# one that does not apply to another release (which may already have the fix) stops the build
# rather than install a CRIU that cannot dump sockets on current kernels.
criu_patch() {
  local src=$1 p patches
  shopt -s nullglob
  patches=("$CRIU_PATCH_DIR"/*.patch)
  shopt -u nullglob
  [ ${#patches[@]} -gt 0 ] ||
    log "warning: no patches in $CRIU_PATCH_DIR: CRIU 4.1.1 cannot dump TCP sockets on Linux >= 6.16"
  for p in "${patches[@]}"; do
    log "patching CRIU: $(basename "$p")"
    patch -d "$src" -p1 --forward --batch --dry-run <"$p" >/dev/null ||
      die "$(basename "$p") does not apply to CRIU $CRIU_VERSION (written for $CRIU_PINNED): check" \
        "whether this release already has the fix and update $CRIU_PATCH_DIR"
    patch -d "$src" -p1 --forward --batch --quiet <"$p" || die "applying $(basename "$p") failed"
  done
}

# apt with a private deb-src list for CRIU_SUITES on the Debian mirror this machine's apt already
# uses (never a hard-coded registry), its lists in $apt_dir.
criu_apt_init() {
  local mirror suite
  mirror=$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | grep -v -- '-security' |
    grep -m1 '/debian/\?$' || true)
  [ -n "$mirror" ] || { log "no Debian mirror in this machine's apt configuration"; return 1; }
  apt_dir=$(mktemp -d)
  chmod 755 "$apt_dir" # apt downloads as _apt
  mkdir -p "$apt_dir/lists/partial"
  for suite in "${CRIU_SUITES[@]}"; do
    echo "deb-src ${mirror%/} $suite main"
  done >"$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Get::List-Cleanup=0")
  log "asking ${mirror%/} (${CRIU_SUITES[*]}) for criu sources >= $CRIU_MIN"
  # A suite that fails to update only drops out of the candidates; the Sources indexes that did
  # arrive are verified against the archive's signed InRelease.
  apt-get "${apt_opts[@]}" update -q >"$apt_dir/update.log" 2>&1 ||
    log "warning: apt-get update of the criu source lists failed in part:" \
      "$(grep '^E:' "$apt_dir/update.log" | head -n 3)"
}

# "VERSION" lines, the suites' order kept, for versions >= CRIU_MIN.
criu_candidates() {
  local suite
  for suite in "${CRIU_SUITES[@]}"; do
    apt-cache "${apt_opts[@]}" madison criu 2>/dev/null |
      awk -F'|' -v s=" $suite/" 'index($3, s) && $3 ~ /Sources/ { gsub(/ /, "", $2); print $2 }'
  done | awk '!seen[$0]++' | while read -r v; do
    if dpkg --compare-versions "$v" ge "$CRIU_MIN"; then echo "$v"; fi
  done
}

# Downloads criu=$1's source into CACHE_DIR with apt-get source and checks its upstream tarball
# against the SHA256 the signed Sources index lists for it (the same list the .dsc carries); sets
# criu_tarball to its path. apt-get checks every file it gets against that list too; some mirrors
# serve the orig tarball but 404 the .dsc and debian tarball, so apt's exit code does not decide.
criu_fetch() {
  local v=$1 uri name sum got
  read -r uri name _ sum < <(apt-get "${apt_opts[@]}" source --download-only --print-uris "criu=$v" 2>/dev/null |
    grep -m1 "\.orig\.tar\.") || { log "criu $v: no upstream tarball in its source package"; return 1; }
  uri=${uri//\'/}
  sum=${sum#SHA256:}
  if [ ! -f "$CACHE_DIR/$name" ] || ! echo "$sum  $CACHE_DIR/$name" | sha256sum -c --status; then
    rm -f "$CACHE_DIR/$name"
    log "fetching criu $v source ($name) with apt-get source"
    (cd "$CACHE_DIR" && apt-get "${apt_opts[@]}" source --download-only "criu=$v" >"$apt_dir/source.log" 2>&1) ||
      true
  fi
  if [ ! -f "$CACHE_DIR/$name" ]; then
    log "criu $v: download of $uri failed: $(grep -E '^(E|Err)' "$apt_dir/source.log" | head -n 3)"
    return 1
  fi
  got=$(sha256sum "$CACHE_DIR/$name" | awk '{ print $1 }')
  if [ "$got" != "$sum" ]; then
    rm -f "$CACHE_DIR/$name"
    log "criu $v: $name has SHA256 $got, the source package lists $sum; removed"
    return 1
  fi
  criu_tarball="$CACHE_DIR/$name"
}

# Sets criu_tarball to the verified upstream tarball to build: the first candidate that fetches,
# else the pinned release already in the cache (offline re-runs). Dies saying what failed.
criu_source() {
  local v listed tried=() pinned="$CACHE_DIR/criu_${CRIU_PINNED}.orig.tar.xz"
  if criu_apt_init; then
    for v in $(criu_candidates); do
      tried+=("$v")
      if criu_fetch "$v"; then return 0; fi
    done
    listed=$(apt-cache "${apt_opts[@]}" madison criu 2>/dev/null | awk -F'|' '{ gsub(/ /, "", $2); print $2 }' |
      sort -uV | xargs)
    [ ${#tried[@]} -gt 0 ] || log "no criu source >= $CRIU_MIN in ${CRIU_SUITES[*]} (apt lists: ${listed:-none})"
  fi
  if [ -f "$pinned" ] && echo "$CRIU_PINNED_SHA256  $pinned" | sha256sum -c --status; then
    log "falling back to the cached, pinned CRIU $CRIU_PINNED"
    criu_tarball=$pinned
    return 0
  fi
  [ -z "$apt_dir" ] || rm -rf "$apt_dir"
  die "no CRIU >= $CRIU_MIN source could be fetched and verified (tried: ${tried[*]:-none}; no verified" \
    "criu_${CRIU_PINNED}.orig.tar.xz in $CACHE_DIR either); see the messages above"
}

if criu_ok; then
  log "CRIU $(criu_version) present at $CRIU_PREFIX/sbin/criu (patches: $(criu_patch_set | awk '{ print $2 }' | xargs))"
else
  if [ -n "$(criu_version)" ] && [ "$(cat "$CRIU_PATCH_MARKER" 2>/dev/null)" != "$(criu_patch_set)" ]; then
    log "CRIU $(criu_version) at $CRIU_PREFIX/sbin/criu was not built with deploy/criu's patches: rebuilding"
  fi
  rm -f "$CRIU_PATCH_MARKER" # written again only once a patched build is installed
  mkdir -p "$CACHE_DIR"
  apt_dir=
  criu_source
  [ -z "$apt_dir" ] || rm -rf "$apt_dir"
  tarball=$criu_tarball
  CRIU_VERSION=$(basename "$tarball")
  CRIU_VERSION=${CRIU_VERSION#criu_}
  CRIU_VERSION=${CRIU_VERSION%.orig.tar.*}
  CRIU_VERSION=${CRIU_VERSION%%+*} # a repack suffix (+dfsg) is not in `criu --version`
  log "building CRIU $CRIU_VERSION (criu + libcriu)"
  build=$(mktemp -d)
  tar -xf "$tarball" -C "$build"
  src=$(find "$build" -maxdepth 1 -mindepth 1 -type d | head -n 1)
  criu_patch "$src"
  # PATH without pyenv shims: CRIU's build scripts use Debian's python3 (python3-protobuf).
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    make -C "$src" -j"$(nproc)" criu lib >"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log"; die "CRIU build failed (log: $build/build.log)"; }
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    make -C "$src" install-criu install-lib PREFIX="$CRIU_PREFIX" SKIP_PIP_INSTALL=1 >>"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log"; die "CRIU install failed (log: $build/build.log)"; }
  ldconfig
  rm -rf "$build"
  mkdir -p "$(dirname "$CRIU_PATCH_MARKER")"
  criu_patch_set >"$CRIU_PATCH_MARKER"
  if [ "$(criu_version)" != "$CRIU_VERSION" ] || ! criu_ok; then
    die "CRIU installed but $CRIU_PREFIX/sbin/criu or criu.pc is not version $CRIU_VERSION (or $CRIU_PATCH_MARKER is off)"
  fi
fi

# containerd's API protos (for the invoker's container runtime) from the one Debian package that
# ships them, extracted rather than installed (installing pulls ~100 Go packages).
PROTO_DIR=/usr/local/share/silt/containerd-protos
if [ ! -f "$PROTO_DIR/.complete" ]; then
  log "extracting containerd API protos into $PROTO_DIR"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -q golang-github-containerd-containerd-dev >/dev/null) ||
    { apt-get update -q && (cd "$tmp" && apt-get download -q golang-github-containerd-containerd-dev >/dev/null); }
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
  rm -rf "$PROTO_DIR" && mkdir -p "$PROTO_DIR"
  gocode="$tmp/x/usr/share/gocode/src"
  (cd "$gocode" && find github.com/containerd/containerd/api github.com/containerd/containerd/runtime/v2/runc/options \
    -name '*.proto' -exec cp --parents {} "$PROTO_DIR" \;)
  rm -rf "$tmp"
  touch "$PROTO_DIR/.complete"
fi

log "criu check:"
"$CRIU_PREFIX/sbin/criu" check || die "criu check failed"
log "installed: $(cmake --version | head -n1), gRPC $(dpkg-query -W -f='${Version}' libgrpc++-dev)," \
  "RocksDB $(dpkg-query -W -f='${Version}' librocksdb-dev), libseccomp $(pkg-config --modversion libseccomp)," \
  "Boost $(dpkg-query -W -f='${Version}' libboost-dev), containerd $(dpkg-query -W -f='${Version}' containerd)," \
  "runc $(dpkg-query -W -f='${Version}' runc), CRIU $("$CRIU_PREFIX/sbin/criu" --version | head -n1 | awk '{print $2}')"
if [ -x /usr/local/cuda/bin/nvcc ]; then log "CUDA: $(/usr/local/cuda/bin/nvcc --version | tail -n1)"; fi
log "done"
