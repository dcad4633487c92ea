#!/usr/bin/env bash
# Provisions CRIU 4.2 or later (Debian forky's criu and the libraries it needs, its libc6 among them)
# into a private prefix, for `cuda-ckpt dump --process` and `cuda-ckpt restore DIR` on a Debian 12
# machine, whose own criu 3.17 fails `criu check` on 6.x kernels. 4.2: on kernels 6.16 and later,
# CRIU 4.1 cannot dump a TCP socket (SO_PASSCRED is refused on it), which every torchrun job has.
# Nothing on the system changes: apt reads forky's package lists into a directory of its own, and
# the packages are unpacked with dpkg -x. CRIU runs through the prefix's own loader, so the
# system's libc stays as it is.
#
# usage: scripts/provision-criu.sh [--prefix DIR] [--suite NAME] [--check]
#   --prefix DIR   where to put it (default .deps/criu; carried to a GPU machine with .deps/)
#   --suite NAME   the Debian release to take it from (default forky)
#   --check        also run `criu check` (needs root)
# Prints the path of the criu wrapper last: point VMMCKPT_CRIU at it, or put its folder on PATH.
# Idempotent: once PREFIX/bin/criu (4.2 or later) is there, nothing is fetched again.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${repo_root}/.deps/criu"
suite=forky
run_check=0
while (($#)); do
  case "$1" in
    --prefix) prefix="$(realpath -m "$2")"; shift ;;
    --suite) suite="$2"; shift ;;
    --check) run_check=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "provision-criu: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { printf 'provision-criu: %s\n' "$*" >&2; }
die() { printf 'provision-criu: error: %s\n' "$*" >&2; exit 1; }

[[ "$(uname -m)" == x86_64 ]] || die "only x86_64 is provided for (this machine is $(uname -m))"
command -v dpkg >/dev/null || die "dpkg not found: this script provisions Debian packages"

wrapper="${prefix}/bin/criu"
root="${prefix}/root"
libdir="${root}/usr/lib/x86_64-linux-gnu"

criu_version() { "${wrapper}" --version 2>&1 | sed -n 's/^Version: *//p' | head -1; }
if [[ -x "${wrapper}" ]]; then  # one provisioned before 4.2 was needed is replaced
  old="$(criu_version)"
  if [[ "$(printf '%s\n' 4.2 "${old:-0}" | sort -V | head -1)" != 4.2 ]]; then
    log "criu ${old:-of unknown version} at ${wrapper} is older than 4.2: provisioning it again"
    rm -rf "${prefix}/bin" "${root}"
  fi
fi

if [[ ! -x "${wrapper}" ]]; then
  command -v apt-get >/dev/null || die "apt-get not found: run this on a Debian machine and copy ${prefix} over"
  apt_dir="${prefix}/apt"
  debs="${prefix}/debs"
  mkdir -p "${apt_dir}/lists/partial" "${apt_dir}/cache/archives/partial" "${debs}"
  echo "deb http://deb.debian.org/debian ${suite} main" > "${apt_dir}/sources.list"
  # Another release's lists, read by apt into a directory of this script's; status=/dev/null makes
  # the dependency closure complete (nothing counts as installed).
  apt_opts=(-o "Dir::State::Lists=${apt_dir}/lists" -o "Dir::Etc::SourceList=${apt_dir}/sources.list"
            -o "Dir::Etc::SourceParts=/dev/null" -o "Dir::Cache=${apt_dir}/cache" -o "Dir::State::status=/dev/null")
  log "reading Debian ${suite}'s package lists"
  apt-get -qq "${apt_opts[@]}" update || die "apt-get update of the ${suite} lists failed (no network to deb.debian.org?)"
  mapfile -t packages < <(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances criu | grep -v '^ ' | grep -v '[<>]' | sort -u)
  ((${#packages[@]})) || die "criu is not in the ${suite} lists"
  log "downloading ${#packages[@]} packages: ${packages[*]}"
  (cd "${debs}" && apt-get -qq "${apt_opts[@]}" download "${packages[@]}") || die "apt-get download failed"
  rm -rf "${root}"
  mkdir -p "${root}"
  for deb in "${debs}"/*.deb; do dpkg -x "${deb}" "${root}"; done
  rm -rf "${root}/usr/share"  # manuals and locales: not needed to run
  [[ -x "${root}/usr/sbin/criu" && -e "${libdir}/ld-linux-x86-64.so.2" ]] || die "the unpacked packages lack criu or the loader"
  mkdir -p "${prefix}/bin"
  # Relative to the wrapper's own place, so the prefix can be moved or carried elsewhere.
  cat > "${wrapper}" <<'EOF'
#!/bin/sh
# CRIU from Debian, run through its own libc (scripts/provision-criu.sh).
here="$(dirname "$(readlink -f "$0")")/../root"
exec "$here/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$here/usr/lib/x86_64-linux-gnu" \
  "$here/usr/sbin/criu" "$@"
EOF
  chmod +x "${wrapper}"
  rm -rf "${apt_dir}" "${debs}"  # the unpacked root is all that is used (and carried)
fi

version="$(criu_version)"
[[ -n "${version}" ]] || die "${wrapper} does not run: $("${wrapper}" --version 2>&1 | head -2)"
log "criu ${version} at ${wrapper}"
if ((run_check)); then
  "${wrapper}" check || die "criu check failed on this machine (kernel $(uname -r))"
fi
echo "${wrapper}"
