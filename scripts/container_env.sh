# Sourced by the scripts that build and run the images. Picks the container engine (podman, else docker; CONTAINER_ENGINE
# overrides) and, for podman, a configuration that works on our machines: runc instead of crun, and no ulimits
# for podman to raise (crun fails there with "setrlimit RLIMIT_NOFILE: Operation not permitted"; see
# ../shared/containers/README.md when this is a checkout of the project's own workplace).
#   engine ARGS...   runs the chosen engine
container_engine=${CONTAINER_ENGINE:-}
if [[ -z $container_engine ]]; then
  if command -v podman >/dev/null; then container_engine=podman
  elif command -v docker >/dev/null; then container_engine=docker
  else
    echo "no container engine: install podman (apt-get install podman runc) or docker" >&2
    return 1 2>/dev/null || exit 1
  fi
fi
if [[ $container_engine == podman && -z ${CONTAINERS_CONF:-} ]]; then
  _conf_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.deps/containers"
  mkdir -p "$_conf_dir"
  if command -v runc >/dev/null; then
    printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' > "$_conf_dir/containers.conf"
  else
    printf '[containers]\ndefault_ulimits = []\n' > "$_conf_dir/containers.conf"
  fi
  export CONTAINERS_CONF="$_conf_dir/containers.conf"
  unset _conf_dir
fi
engine() { "$container_engine" "$@"; }
