#!/usr/bin/env bash
# Builds the image readers' libFuzzer targets (the GPU image's and the whole-process image's) with clang and fuzzes each for a while on a copy of the seed corpus.
# Usage: scripts/fuzz.sh [--seconds N] [--jobs N]
#   --seconds N  how long each target is fuzzed (default 60)
#   --jobs N     parallel fuzzing processes per target (default 1)
# Builds in build-fuzz/; new corpus entries go to build-fuzz/corpus-TARGET, crash inputs to
# build-fuzz/artifacts-TARGET/. Exits 1 when a crash, leak, timeout or out-of-memory was found.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

seconds=60
jobs=1
while (($#)); do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a number}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (usage: scripts/fuzz.sh [--seconds N] [--jobs N])" >&2; exit 2 ;;
  esac
done
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || { echo "error: --seconds wants a positive integer" >&2; exit 2; }
[[ "$jobs" =~ ^[0-9]+$ && "$jobs" -gt 0 ]] || { echo "error: --jobs wants a positive integer" >&2; exit 2; }

root="$PWD"
build="$root/build-fuzz"
targets=(manifest_fuzzer image_fuzzer process_image_fuzzer)
# Inputs larger than the seeds by a wide margin, yet small enough to keep thousands of runs a second.
declare -A max_len=([manifest_fuzzer]=65536 [image_fuzzer]=131072 [process_image_fuzzer]=65536)
declare -A corpus=([manifest_fuzzer]="$root/tests/fuzz/corpus/manifest" [image_fuzzer]="$root/tests/fuzz/corpus/image"
                   [process_image_fuzzer]="$root/tests/fuzz/corpus/process")
declare -A dict=([manifest_fuzzer]="$root/tests/fuzz/manifest.dict" [image_fuzzer]="$root/tests/fuzz/manifest.dict"
                 [process_image_fuzzer]="$root/tests/fuzz/process.dict")
libfuzzer_limits=(-timeout=10 -rss_limit_mb=2048)

# clang, and its libFuzzer runtime, which Debian's clang only recommends (libclang-rt-dev).
VMMCKPT_NEEDS+=("cmd:clang|clang" "cmd:clang++|clang")
vmmckpt_install_packages
vmmckpt_check_cuda_toolkit
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe_dir/probe.cpp"
if ! clang++ -fsanitize=fuzzer "$probe_dir/probe.cpp" -o "$probe_dir/probe" 2>/dev/null; then
  echo "==> installing missing packages: libclang-rt-dev"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "error: need root or sudo to install: libclang-rt-dev" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libclang-rt-dev
  clang++ -fsanitize=fuzzer "$probe_dir/probe.cpp" -o "$probe_dir/probe" ||
    { echo "error: clang++ still cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

start=$(date +%s)
generator=()
command -v ninja >/dev/null && [ ! -f "$build/CMakeCache.txt" ] && generator=(-G Ninja)
echo "==> configuring $build (clang, VMMCKPT_FUZZ=ON)"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DVMMCKPT_FUZZ=ON >"$probe_dir/configure.log" ||
  { cat "$probe_dir/configure.log"; exit 1; }
echo "==> building ${targets[*]}"
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
built=$(date +%s)

# The image target's private directories: in memory where there is /dev/shm, removed at the end.
if [ -w /dev/shm ]; then
  VMMCKPT_FUZZ_TMPDIR="$(mktemp -d /dev/shm/vmmckpt-fuzz-XXXXXX)"
else
  VMMCKPT_FUZZ_TMPDIR="$(mktemp -d)"
fi
export VMMCKPT_FUZZ_TMPDIR
trap 'rm -rf "$probe_dir" "$VMMCKPT_FUZZ_TMPDIR"' EXIT
export UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

failed=0
# Names the inputs libFuzzer saved in DIR (crash-*, leak-*, timeout-*, oom-*), newer than the marker.
report_artifacts() {
  local dir="$1" marker="$2" f found=0
  while IFS= read -r f; do
    echo "    reproducer: $f   (rerun: $build/bin/$3 $f)"
    found=1
  done < <(find "$dir" -maxdepth 1 -type f -newer "$marker" \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'slow-unit-*' \) | sort)
  return $((found == 0))
}

# Inputs that crashed once must never crash again, in either target.
mapfile -t regressions < <(find tests/fuzz/regressions -maxdepth 1 -type f ! -name 'README*' | sort)
if ((${#regressions[@]})); then
  echo "==> ${#regressions[@]} regression inputs through every target"
  for t in "${targets[@]}"; do
    log="$build/regressions-$t.log"
    if ! "$build/bin/$t" "${libfuzzer_limits[@]}" "${regressions[@]}" >"$log" 2>&1; then
      echo "FAILED: $t on tests/fuzz/regressions (log: $log):"
      grep -E '^(==[0-9]+== ?ERROR|SUMMARY|Running:)|runtime error' "$log" | tail -n 20
      failed=1
    fi
  done
fi

# fuzz_target T: fuzzes T for $seconds, prints its figures; 1 when it found something.
fuzz_target() {
  local t="$1" dir art run marker args t0 t1 status execs entries
  dir="$build/corpus-$t"
  art="$build/artifacts-$t"
  run="$build/run-$t"
  mkdir -p "$dir" "$art" "$run"
  rm -f "$run"/*.log "$build/fuzz-$t.status"
  # A copy: the fuzzer adds to its first corpus directory, and the repository's seeds stay as committed.
  cp -n "${corpus[$t]}"/* "$dir"/ 2>/dev/null || true
  marker="$run/started"
  touch "$marker"
  echo "==> fuzzing $t for ${seconds}s ($jobs job(s), corpus $dir)"
  args=("${libfuzzer_limits[@]}" -max_len="${max_len[$t]}" -max_total_time="$seconds" -print_final_stats=1
        -dict="${dict[$t]}" -artifact_prefix="$art/")
  t0=$(date +%s)
  status=0
  if ((jobs == 1)); then
    # The outer timeout only guards against the fuzzer itself hanging; -timeout catches slow inputs.
    timeout --kill-after=30 $((seconds + 300)) "$build/bin/$t" "${args[@]}" "$dir" >"$run/fuzz-0.log" 2>&1 || status=$?
  else
    # Each job writes fuzz-N.log in the working directory.
    (cd "$run" && timeout --kill-after=30 $((seconds + 300)) "$build/bin/$t" "${args[@]}" \
       -jobs="$jobs" -workers="$jobs" "$dir") >"$run/parent.log" 2>&1 || status=$?
  fi
  t1=$(date +%s)
  execs=$(cat "$run"/fuzz-*.log 2>/dev/null | awk '/^stat::number_of_executed_units:/ {s += $2} END {print s + 0}')
  entries=$(find "$dir" -type f | wc -l)
  printf '    %s: %s executions in %ss (%s/s), corpus %s entries\n' "$t" "$execs" $((t1 - t0)) \
    $((execs / ((t1 - t0) > 0 ? (t1 - t0) : 1))) "$entries"
  if report_artifacts "$art" "$marker" "$t" || ((status != 0)); then
    echo "FAILED: $t found a crash, leak, timeout or out-of-memory (exit status $status); logs in $run/:"
    grep -hE '^(==[0-9]+== ?ERROR|SUMMARY)|runtime error|^[a-z_]+_fuzzer: ' "$run"/*.log | head -n 20 || true
    return 1
  fi
}

# The targets side by side, as many at a time as there are cores; each one's lines printed together.
parallel=$(nproc)
pids=()
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  (found=0; fuzz_target "$t" >"$build/fuzz-$t.out" 2>&1 || found=$?; echo "$found" >"$build/fuzz-$t.status") &
  pids+=($!)
done
wait "${pids[@]}" || true
for t in "${targets[@]}"; do
  cat "$build/fuzz-$t.out"
  [ "$(cat "$build/fuzz-$t.status" 2>/dev/null)" = 0 ] || failed=1
done

end=$(date +%s)
echo "==> configure + build $((built - start))s, fuzzing $((end - built))s"
if ((failed)); then
  echo "fuzzing FOUND PROBLEMS: keep each reproducer in tests/fuzz/regressions/ once it is fixed" >&2
  exit 1
fi
echo "fuzzing found nothing"
