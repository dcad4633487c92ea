#!/usr/bin/env bash
# Downloads the header-only dependencies as Debian packages and unpacks them into .deps/prefix,
# so a machine without them (the GPU machine: no apt, no internet) can build with
# VMMCKPT_DEPS_PREFIX=$PWD/.deps/prefix. Run on a Debian machine with network; idempotent.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps_dir="${repo_root}/.deps"
deb_dir="${deps_dir}/debs"
prefix="${deps_dir}/prefix"
# libvulkan-dev and libvulkan1: the Vulkan headers and loader for the BAR probe on GPU machines (docs/peek.md).
packages=(libspdlog-dev libfmt-dev catch2 libcli11-dev nlohmann-json3-dev libxxhash-dev libvulkan-dev libvulkan1)

log() { printf 'fetch-deps: %s\n' "$*"; }
die() { printf 'fetch-deps: error: %s\n' "$*" >&2; exit 1; }

command -v apt-get >/dev/null || die "apt-get not found: run this on a Debian/Ubuntu machine and copy .deps/ over"
command -v dpkg >/dev/null || die "dpkg not found"

mkdir -p "${deb_dir}" "${prefix}"

# A package counts as present when a .deb whose name starts with "<pkg>_" is already there.
have_deb() { compgen -G "${deb_dir}/${1}_*.deb" >/dev/null; }

missing=()
for pkg in "${packages[@]}"; do
  if have_deb "${pkg}"; then
    log "have ${pkg}"
  else
    missing+=("${pkg}")
  fi
done

if ((${#missing[@]})); then
  log "downloading: ${missing[*]}"
  # apt-get download writes into the current directory; subshell keeps our cwd.
  if ! (cd "${deb_dir}" && apt-get download "${missing[@]}"); then
    # Usually a fresh container with no package lists yet.
    log "download failed; running apt-get update and retrying"
    if [[ ${EUID} -eq 0 ]]; then apt-get update -qq; else sudo apt-get update -qq; fi
    (cd "${deb_dir}" && apt-get download "${missing[@]}") || die "apt-get download failed for: ${missing[*]}"
  fi
fi

for pkg in "${packages[@]}"; do
  have_deb "${pkg}" || die "no .deb for ${pkg} in ${deb_dir}"
done

# Unpacking is cheap and dpkg -x overwrites, so always redo it: a stale prefix never survives.
for deb in "${deb_dir}"/*.deb; do
  log "unpacking $(basename "${deb}")"
  dpkg -x "${deb}" "${prefix}"
done

# What no build reads, so that .deps stays small enough to carry to a GPU machine: docs, the Vulkan registry and
# the Vulkan C++ bindings (the BAR probe uses the C headers).
rm -rf "${prefix}/usr/share/doc" "${prefix}/usr/share/vulkan" "${prefix}"/usr/include/vulkan/*.hpp

for header in spdlog/spdlog.h fmt/format.h catch2/catch.hpp CLI/CLI.hpp nlohmann/json.hpp xxhash.h; do
  [[ -f "${prefix}/usr/include/${header}" ]] || die "unpacked prefix lacks usr/include/${header}"
done

log "done: export VMMCKPT_DEPS_PREFIX=${prefix}"
