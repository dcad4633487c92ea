#!/usr/bin/env bash
# The install, checked from outside as a user gets it: install_check.sh MODE ARGS (tests/install/CMakeLists.txt).
#   install BUILD PREFIX         a fresh `cmake --install` of the build into PREFIX
#   files PREFIX LIBDIR BUILD    every installed file is there; no RPATH into the build tree; completion knows every subcommand
#   run PREFIX LIBDIR PROGRAM    the installed cuda-ckpt runs PROGRAM under the installed shim, dumps it, verifies the image
#   locate PREFIX LIBDIR ARCH PROGRAM  an installed cuda-ckpt finds the shim through a symlink and in lib/ARCH
#   find_package PREFIX          a CMake project finds vmmckpt in PREFIX
#   deb BUILD CPACK              cpack -G DEB builds a .deb with the tool, the shim and no libcuda dependency
set -euo pipefail

mode="$1"
shift
scratch="$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/vmmckpt-install-$mode.XXXXXX")")"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# start_under CUDA_CKPT PROGRAM: `CUDA_CKPT run -- PROGRAM` in the background (our own program, so that a
# sanitizer build's shim is preloaded only where the sanitizer runs); sets pid once it says ready.
start_under() {
  local out="$scratch/out.${#pids[@]}" err="$scratch/err.${#pids[@]}"
  env -u VMMCKPT_SHIM "$1" run -- "$2" --seconds 120 >"$out" 2>"$err" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 300); do
    grep -q '^ready$' "$out" && return 0
    kill -0 "$pid" 2>/dev/null || fail "the program exited before it was ready: $(cat "$err")"
    sleep 0.1
  done
  fail "the program never said ready"
}

# preloaded_shim PID: the path of the libvmmckpt.so mapped in the process.
preloaded_shim() {
  grep -o '/[^ ]*libvmmckpt\.so$' "/proc/$1/maps" | sort -u
}

case "$mode" in
install)
  build="$1" prefix="$2"
  rm -rf "$prefix"
  "${CMAKE:-cmake}" --install "$build" --prefix "$prefix"
  ;;

files)
  prefix="$1" libdir="$2" build="$3"
  for f in bin/cuda-ckpt "$libdir/libvmmckpt.so" share/man/man1/cuda-ckpt.1 \
           share/bash-completion/completions/cuda-ckpt share/doc/vmmckpt/README.md \
           share/doc/vmmckpt/docs/image-format.md "$libdir/cmake/vmmckpt/vmmckptConfig.cmake" \
           "$libdir/cmake/vmmckpt/vmmckptConfigVersion.cmake" "$libdir/cmake/vmmckpt/vmmckptTargets.cmake" \
           include/vmmckpt/vmmckpt.h lib/criu/vmmckpt_criu.so share/vmmckpt/provision-criu.sh; do
    [ -s "$prefix/$f" ] || fail "$prefix/$f is missing or empty"
  done
  for f in "$prefix/bin/cuda-ckpt" "$prefix/$libdir/libvmmckpt.so"; do
    # Each command's output is taken whole before grep -q reads it: grep leaving at its first match would
    # fail a writer still writing with SIGPIPE, and pipefail the check (emu.install.run_dump_verify did).
    dynamic="$(readelf -d "$f")"
    if grep -E 'R(UN)?PATH' <<<"$dynamic" | grep -qF "$build"; then
      fail "$f carries an RPATH into the build tree: $(readelf -d "$f" | grep -E 'R(UN)?PATH')"
    fi
  done
  # The CRIU plugin exports its descriptor and nothing else, so that none of its code meets CRIU's own names
  # (the C++ library's unique objects, type u, are shared by design).
  exported="$(nm -D --defined-only "$prefix/lib/criu/vmmckpt_criu.so" | awk '$2 != "u" {print $3}' | grep -v '^_init$\|^_fini$')"
  [ "$exported" = CR_PLUGIN_DESC ] || fail "the CRIU plugin exports more than CR_PLUGIN_DESC: $(head -5 <<<"$exported")"
  grep -q '^\.TH CUDA-CKPT 1' "$prefix/share/man/man1/cuda-ckpt.1" || fail "the man page has no .TH line"
  # Rendered with nroff itself where there is one: `man` is a stub on minimized systems (the GPU hosts).
  if command -v nroff >/dev/null; then
    page="$(nroff -man -rLL=300n -rHY=0 "$prefix/share/man/man1/cuda-ckpt.1" 2>/dev/null)"
    grep -q 'Write a consistent image' <<<"$page" || fail "nroff does not render the dump section of the page"
  fi
  # Every subcommand the tool lists has a man section and is completed.
  subcommands="$("$prefix/bin/cuda-ckpt" --help | sed -n '/^[Ss][Uu][Bb][Cc][Oo][Mm][Mm][Aa][Nn][Dd][Ss]:/,/^$/p' |
                 grep -E '^  [a-z]' | awk '{ print $1 }')"
  [ -n "$subcommands" ] || fail "no subcommands in cuda-ckpt --help"
  bash -n "$prefix/share/bash-completion/completions/cuda-ckpt" || fail "the completion script does not parse"
  for sub in $subcommands; do
    grep -q "^\.SS $sub\$" "$prefix/share/man/man1/cuda-ckpt.1" || fail "the man page has no section for $sub"
    reply="$(bash -c 'source "$1"; COMP_WORDS=(cuda-ckpt "$2"); COMP_CWORD=1; _cuda_ckpt; printf "%s\n" "${COMPREPLY[@]}"' \
             _ "$prefix/share/bash-completion/completions/cuda-ckpt" "$sub")"
    grep -qx "$sub" <<<"$reply" || fail "the completion does not offer the subcommand $sub"
  done
  reply="$(bash -c 'source "$1"; COMP_WORDS=(cuda-ckpt dump 1 --dead); COMP_CWORD=3; _cuda_ckpt; printf "%s\n" "${COMPREPLY[@]}"' \
           _ "$prefix/share/bash-completion/completions/cuda-ckpt")"
  [ "$reply" = "--deadline" ] || fail "dump --dead completes to '$reply', not --deadline"
  ;;

run)
  prefix="$1" libdir="$2" program="$3"
  cuda_ckpt="$prefix/bin/cuda-ckpt"
  start_under "$cuda_ckpt" "$program"
  shim="$(preloaded_shim "$pid")"
  [ "$shim" = "$(realpath "$prefix")/$libdir/libvmmckpt.so" ] || fail "the program runs under '$shim', not the installed shim"
  "$cuda_ckpt" dump "$pid" -o "$scratch/image"
  "$cuda_ckpt" verify "$scratch/image"
  # Taken whole first, as above.
  inspected="$("$cuda_ckpt" inspect --json "$scratch/image")"
  grep -q "\"pid\": *$pid" <<<"$inspected" || fail "inspect does not name process $pid"
  ;;

locate)
  prefix="$1" libdir="$2" arch="$3" program="$4"
  real="$(realpath "$prefix")"
  # A symlink elsewhere: the shim is found next to the real executable.
  mkdir "$scratch/elsewhere"
  ln -s "$real/bin/cuda-ckpt" "$scratch/elsewhere/cuda-ckpt"
  start_under "$scratch/elsewhere/cuda-ckpt" "$program"
  shim="$(preloaded_shim "$pid")"
  [ "$shim" = "$real/$libdir/libvmmckpt.so" ] || fail "through a symlink the shim found is '$shim'"
  # Debian's multiarch layout: bin/ and lib/ARCH/.
  if [ -z "$arch" ]; then
    echo "no multiarch folder on this system (CMAKE_LIBRARY_ARCHITECTURE is empty): that layout not checked"
    exit 0
  fi
  mkdir -p "$scratch/multiarch/bin" "$scratch/multiarch/lib/$arch"
  cp "$real/bin/cuda-ckpt" "$scratch/multiarch/bin/"
  cp "$real/$libdir/libvmmckpt.so" "$scratch/multiarch/lib/$arch/"
  start_under "$scratch/multiarch/bin/cuda-ckpt" "$program"
  shim="$(preloaded_shim "$pid")"
  [ "$shim" = "$scratch/multiarch/lib/$arch/libvmmckpt.so" ] || fail "in the multiarch layout the shim found is '$shim'"
  # With no shim anywhere, the message lists where it looked.
  rm "$scratch/multiarch/lib/$arch/libvmmckpt.so"
  if env -u VMMCKPT_SHIM "$scratch/multiarch/bin/cuda-ckpt" run -- "$program" 2>"$scratch/err"; then
    fail "run without a shim succeeded"
  fi
  grep -qF "$scratch/multiarch/lib/$arch/libvmmckpt.so" "$scratch/err" || fail "the error does not say where it looked: $(cat "$scratch/err")"
  ;;

find_package)
  prefix="$1"
  mkdir "$scratch/src"
  cat >"$scratch/src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(uses_vmmckpt LANGUAGES C)
find_package(vmmckpt 0.1 REQUIRED)
if(NOT TARGET vmmckpt::vmmckpt OR NOT TARGET vmmckpt::cuda-ckpt)
  message(FATAL_ERROR "find_package(vmmckpt) gave no vmmckpt::vmmckpt or vmmckpt::cuda-ckpt")
endif()
get_target_property(shim vmmckpt::vmmckpt LOCATION)
if(NOT shim STREQUAL vmmckpt_SHIM_LIBRARY OR NOT EXISTS "${vmmckpt_CUDA_CKPT_EXECUTABLE}")
  message(FATAL_ERROR "paths disagree: ${shim} ${vmmckpt_SHIM_LIBRARY} ${vmmckpt_CUDA_CKPT_EXECUTABLE}")
endif()
message(STATUS "vmmckpt ${vmmckpt_VERSION}: ${vmmckpt_SHIM_LIBRARY} ${vmmckpt_CUDA_CKPT_EXECUTABLE}")
# The in-process API: its header through the target, its functions from the shim.
add_executable(uses_api uses_api.c)
target_link_libraries(uses_api PRIVATE vmmckpt::vmmckpt)
CMAKE
  cat >"$scratch/src/uses_api.c" <<'C'
#include <stdio.h>
#include <vmmckpt/vmmckpt.h>
int main(void) {
  vmmckpt_stats stats;
  if (vmmckpt_api_version() != VMMCKPT_API_VERSION || vmmckpt_state() != 0) return 1;
  if (vmmckpt_resume(&stats) != VMMCKPT_E_STATE || vmmckpt_last_error()[0] == 0) return 2;
  printf("api %d: %s\n", vmmckpt_api_version(), vmmckpt_last_error());
  return 0;
}
C
  "${CMAKE:-cmake}" -S "$scratch/src" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$(realpath "$prefix")"
  "${CMAKE:-cmake}" --build "$scratch/build"
  "$scratch/build/uses_api" || fail "a program built against the installed vmmckpt.h and shim failed ($?)"
  ;;

deb)
  build="$1" cpack="$2"
  if ! command -v dpkg-deb >/dev/null; then
    echo "SKIPPED: dpkg-deb is not installed (it comes with Debian's dpkg), so no .deb can be built"
    exit 77
  fi
  "$cpack" -G DEB --config "$build/CPackConfig.cmake" -B "$scratch"
  deb="$(ls "$scratch"/vmmckpt_*.deb)"
  contents="$(dpkg-deb -c "$deb")"
  for f in ./usr/bin/cuda-ckpt /libvmmckpt.so ./usr/share/man/man1/cuda-ckpt.1 ./usr/share/bash-completion/completions/cuda-ckpt \
           /cmake/vmmckpt/vmmckptConfig.cmake ./usr/share/doc/vmmckpt/README.md ./usr/include/vmmckpt/vmmckpt.h \
           ./usr/lib/criu/vmmckpt_criu.so; do
    grep -qF "$f" <<<"$contents" || fail "$deb lacks $f"
  done
  [ "$(dpkg-deb -f "$deb" Package)" = vmmckpt ] || fail "the package is not named vmmckpt"
  if dpkg-deb -f "$deb" Depends | grep -qi cuda; then fail "the package depends on CUDA: $(dpkg-deb -f "$deb" Depends)"; fi
  # The package's binaries are stripped: they must still start.
  dpkg-deb -x "$deb" "$scratch/root"
  "$scratch/root/usr/bin/cuda-ckpt" --version | grep -q '^cuda-ckpt ' || fail "the packaged cuda-ckpt does not start"
  echo "built $(basename "$deb")"
  ;;

*) fail "unknown mode $mode" ;;
esac
