#!/usr/bin/env bash
# Installs everything Silt needs to build, test and run on Debian 12 (bookworm), as root.
# Idempotent: a second run checks what is there and takes seconds.
set -euo pipefail

CRIU_VERSION=4.1.1
CRIU_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
CRIU_PREFIX=/usr/local
CACHE_DIR=${SILT_SETUP_CACHE:-/var/cache/silt-setup}

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
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev nginx-light redis-server redis-tools
  # runtimes
  containerd runc iproute2 busybox-static
  # CRIU saves and restores network namespaces with iptables-save/-restore
  iptables
  # CRIU build dependencies
  libprotobuf-c-dev protobuf-c-compiler libnl-3-dev libnet1-dev libcap-dev libbsd-dev
  libaio-dev uuid-dev libnftables-dev libgnutls28-dev python3-protobuf xz-utils
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

criu_ok() {
  [ -x "$CRIU_PREFIX/sbin/criu" ] && "$CRIU_PREFIX/sbin/criu" --version 2>/dev/null | grep -q "Version: $CRIU_VERSION" &&
    pkg-config --atleast-version=4.0 criu 2>/dev/null
}
if criu_ok; then
  log "CRIU $CRIU_VERSION present at $CRIU_PREFIX/sbin/criu"
else
  mkdir -p "$CACHE_DIR"
  tarball="$CACHE_DIR/criu_${CRIU_VERSION}.orig.tar.xz"
  if [ ! -f "$tarball" ] || ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --status; then
    log "fetching CRIU $CRIU_VERSION upstream source tarball from Debian's archive"
    apt_dir=$(mktemp -d)
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
    # The mirror this machine's apt already uses (never a hard-coded registry).
    mirror=$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | grep -v -- '-security' |
      grep -m1 '/debian/\?$' || true)
    [ -n "$mirror" ] || die "no Debian mirror in this machine's apt configuration"
    echo "deb-src ${mirror%/} trixie main" >"$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
      -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Get::List-Cleanup=0")
    apt-get "${apt_opts[@]}" update -q
    # The .dsc and debian tarball 404 on the mirror; the orig tarball downloads. apt exits 100.
    (cd "$CACHE_DIR" && apt-get "${apt_opts[@]}" source --download-only "criu=${CRIU_VERSION}-1" || true)
    rm -rf "$apt_dir"
    [ -f "$tarball" ] || die "could not download criu_${CRIU_VERSION}.orig.tar.xz"
    echo "$CRIU_SHA256  $tarball" | sha256sum -c --status ||
      { rm -f "$tarball"; die "CRIU tarball checksum mismatch (expected $CRIU_SHA256)"; }
  fi
  log "building CRIU $CRIU_VERSION (criu + libcriu)"
  build=$(mktemp -d)
  tar -xf "$tarball" -C "$build"
  src=$(find "$build" -maxdepth 1 -mindepth 1 -type d | head -n 1)
  # PATH without pyenv shims: CRIU's build scripts use Debian's python3 (python3-protobuf).
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    make -C "$src" -j"$(nproc)" criu lib >"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log"; die "CRIU build failed (log: $build/build.log)"; }
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    make -C "$src" install-criu install-lib PREFIX="$CRIU_PREFIX" SKIP_PIP_INSTALL=1 >>"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log"; die "CRIU install failed (log: $build/build.log)"; }
  ldconfig
  rm -rf "$build"
  criu_ok || die "CRIU installed but $CRIU_PREFIX/sbin/criu or criu.pc is not version $CRIU_VERSION"
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
