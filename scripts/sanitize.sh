#!/usr/bin/env bash
# Builds vmmckpt with g++'s sanitizers in build dirs of their own and runs the tests under them.
#
# usage: scripts/sanitize.sh [asan|tsan|all]      (default: all)
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer) on everything, in build-asan:
#         ctest -L unit and ctest -L emu (the shim preloaded into test programs, cuda-ckpt, the emulator).
#   tsan  ThreadSanitizer, in build-tsan: ctest -L unit (allocator and pool logic with the many-thread
#         test, image writer and reader, protocol). Not the emulator's tests nor the end-to-end tests:
#         the emulator places memory at addresses ThreadSanitizer keeps for itself (docs/reliability.md).
# env:   VMMCKPT_SANITIZE_JOBS (build jobs and tests at a time, default nproc), extra ctest args after "--".
# Each mode prints one summary line and the script exits non-zero on any sanitizer report or test failure.
# Every report, from every process the tests start, goes to build-<mode>/sanitizer-logs/ (log_path), so
# one in a child whose exit status a test ignores still fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

modes=()
ctest_extra=()
while (($#)); do
  case "$1" in
    asan|tsan) modes+=("$1") ;;
    all) modes+=(asan tsan) ;;
    --) shift; ctest_extra=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
((${#modes[@]})) || modes=(asan tsan)

vmmckpt_install_packages || exit 1
vmmckpt_check_cuda_toolkit || exit 1

supp_dir="$PWD/scripts/sanitizers"
jobs="${VMMCKPT_SANITIZE_JOBS:-$(nproc)}"
summaries=()
status=0

# build DIR FLAGS [TARGET...]: configure (RelWithDebInfo, like the normal build) and build with FLAGS on every
# compile and link. g++ links the sanitizer runtimes into shared libraries too (DT_NEEDED), so the
# shim's -Wl,-z,defs still holds.
build() {
  local dir="$1" flags="$2" generator=() targets=()
  shift 2
  (($#)) && targets=(--target "$@")
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >"$dir/configure.log" 2>&1 \
    || { cat "$dir/configure.log"; return 1; }
  cmake --build "$dir" -j "$jobs" "${targets[@]}"
}

# reports DIR: how many sanitizer reports the processes left in DIR; prints them.
reports() {
  local dir="$1" n=0 f
  for f in "$dir"/*; do
    [ -s "$f" ] || continue
    n=$((n + 1))
    echo "----- sanitizer report: $f" >&2
    cat "$f" >&2
  done
  echo "$n"
}

run_mode() {
  local mode="$1" dir="build-$mode" flags targets=() tests_ok=1 start=$SECONDS
  local logs="$PWD/$dir/sanitizer-logs"
  case "$mode" in
    asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" ;;
    # Only what the tsan tests run: a fraction of the build on CI's two cores.
    tsan) flags="-fsanitize=thread -fno-omit-frame-pointer" targets=(vmmckpt_unit_tests vmmckpt_log_tests) ;;
  esac
  echo "==> [$mode] configure and build in $dir ($flags)"
  mkdir -p "$dir"
  if ! build "$dir" "$flags" "${targets[@]}"; then
    summaries+=("sanitize $mode: BUILD FAILED after $((SECONDS - start)) s")
    status=1
    return
  fi
  rm -rf "$logs"
  mkdir -p "$logs"
  local build_s=$((SECONDS - start))

  (
    case "$mode" in
      asan)
        # The end-to-end tests preload the instrumented shim. Into our own (instrumented) programs alone:
        # libasan then follows it in the link map, still before libc, so its interceptors are the ones
        # used, and verify_asan_link_order=0 accepts that. Into programs that are not ours (sh,
        # python3) libasan must come first: tests/emu/process.cpp puts VMMCKPT_TEST_PRELOAD_FIRST in
        # front of any LD_PRELOAD a test sets.
        # detect_leaks=1: a process that ends normally is checked for leaks; the ones the tests kill
        # (SIGKILL) are never checked, so they need no exception. lsan.supp says what is accepted.
        export VMMCKPT_TEST_PRELOAD_FIRST="$(g++ -print-file-name=libasan.so)"
        export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1:verify_asan_link_order=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:log_path=$logs/asan"
        export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan"
        export LSAN_OPTIONS="suppressions=$supp_dir/lsan.supp:print_suppressions=0"
        echo "==> [$mode] ctest -L unit, ctest -L emu"
        ctest --test-dir "$dir" -L unit -j "$jobs" --output-on-failure --no-tests=error "${ctest_extra[@]}" || exit 1
        ctest --test-dir "$dir" -L emu -j "$jobs" --output-on-failure --no-tests=error "${ctest_extra[@]}" || exit 1
        ;;
      tsan)
        export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:suppressions=$supp_dir/tsan.supp:print_suppressions=0:log_path=$logs/tsan"
        echo "==> [$mode] ctest -L unit"
        ctest --test-dir "$dir" -L unit -j "$jobs" --output-on-failure --no-tests=error "${ctest_extra[@]}" || exit 1
        ;;
    esac
  ) || tests_ok=0

  local n
  n=$(reports "$logs")
  local line="sanitize $mode: build ${build_s} s, total $((SECONDS - start)) s; tests $([ $tests_ok = 1 ] && echo passed || echo FAILED); $n sanitizer report(s)"
  echo "==> $line"
  summaries+=("$line")
  if [ $tests_ok = 0 ] || [ "$n" != 0 ]; then status=1; fi
}

for mode in "${modes[@]}"; do run_mode "$mode"; done
echo
printf '%s\n' "${summaries[@]}"
exit $status
