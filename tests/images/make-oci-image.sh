#!/usr/bin/env bash
# Builds an OCI image archive from root directories, reproducibly (the same
# inputs give the same bytes: sorted entries, times at 0, owner root, gzip -n),
# without docker or a registry: one layer per --layer DIR, bottom first.
#
#   make-oci-image.sh --name NAME --layer DIR [--layer DIR ...] -o OUT.tar
#       [--format oci|docker]        OCI image layout (default) or `docker save`
#       [--entrypoint '["/bin/x"]']  the config's Entrypoint (JSON array)
#       [--cmd '["arg"]']            Cmd (JSON array)
#       [--env K=V ...]              Env (PATH=/usr/bin:/bin unless given)
#       [--workdir DIR] [--port 8080/tcp]
#
# `silt image import OUT.tar` loads either format.
set -euo pipefail

name="" out="" format=oci entrypoint=null cmd=null workdir=/ port=""
layers=() envs=()
while (($#)); do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --layer) layers+=("$2"); shift 2 ;;
    -o) out=$2; shift 2 ;;
    --format) format=$2; shift 2 ;;
    --entrypoint) entrypoint=$2; shift 2 ;;
    --cmd) cmd=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "make-oci-image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $name && -n $out && ${#layers[@]} -gt 0 ]] ||
  { echo "usage: make-oci-image.sh --name NAME --layer DIR... -o OUT.tar" >&2; exit 2; }
[[ $format == oci || $format == docker ]] ||
  { echo "make-oci-image.sh: --format is oci or docker" >&2; exit 2; }
((${#envs[@]})) || envs=(PATH=/usr/local/bin:/usr/bin:/bin)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
det_tar() { tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner "$@"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }

mkdir -p "$work/out/blobs/sha256"
diff_ids="" layer_descs="" docker_layers=""
for dir in "${layers[@]}"; do
  det_tar -C "$dir" -cf "$work/layer.tar" .
  diff_id=$(sha "$work/layer.tar")
  diff_ids+="${diff_ids:+,}\"sha256:$diff_id\""
  if [[ $format == oci ]]; then
    gzip -n -6 -c "$work/layer.tar" > "$work/layer.tar.gz"
    d=$(sha "$work/layer.tar.gz")
    mv "$work/layer.tar.gz" "$work/out/blobs/sha256/$d"
    layer_descs+="${layer_descs:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$d\",\"size\":$(size "$work/out/blobs/sha256/$d")}"
  else
    mkdir -p "$work/out/$diff_id"
    mv "$work/layer.tar" "$work/out/$diff_id/layer.tar"
    docker_layers+="${docker_layers:+,}\"$diff_id/layer.tar\""
  fi
done

env_json=""
for e in "${envs[@]}"; do env_json+="${env_json:+,}$(json_str "$e")"; done
ports_json="{}"
[[ -z $port ]] || ports_json="{$(json_str "$port"):{}}"
printf '{"architecture":"amd64","os":"linux","config":{"Env":[%s],"Entrypoint":%s,"Cmd":%s,"WorkingDir":%s,"ExposedPorts":%s},"rootfs":{"type":"layers","diff_ids":[%s]}}' \
  "$env_json" "$entrypoint" "$cmd" "$(json_str "$workdir")" "$ports_json" "$diff_ids" > "$work/config.json"
config=$(sha "$work/config.json")

if [[ $format == oci ]]; then
  mv "$work/config.json" "$work/out/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
    "$config" "$(size "$work/out/blobs/sha256/$config")" "$layer_descs" > "$work/manifest.json"
  manifest=$(sha "$work/manifest.json")
  msize=$(size "$work/manifest.json")
  mv "$work/manifest.json" "$work/out/blobs/sha256/$manifest"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":%s,"org.opencontainers.image.ref.name":%s}}]}' \
    "$manifest" "$msize" "$(json_str "$name")" "$(json_str "${name##*:}")" > "$work/out/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$work/out/oci-layout"
else
  mv "$work/config.json" "$work/out/$config.json"
  printf '[{"Config":"%s.json","RepoTags":[%s],"Layers":[%s]}]' \
    "$config" "$(json_str "$name")" "$docker_layers" > "$work/out/manifest.json"
fi
det_tar -C "$work/out" -cf "$out" .
