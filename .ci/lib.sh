# Helpers for the .ci scripts (sourced, not run).

# Run a command silently; on failure show its output and what failed.
quiet() {
  local out
  if ! out=$("$@" 2>&1); then
    printf '%s\n' "$out" >&2
    echo "failed: $*" >&2
    return 1
  fi
}

# CI containers run as root; hosted runners (GitHub's) as a passwordless sudoer.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  quiet as_root apt-get update -qq
  quiet as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}
