#!/usr/bin/env bash
# Builds vmmckpt with the GPU tests on a GPU machine and runs them (ctest -L gpu) plus every test
# that needs no GPU (ctest -LE gpu) in the same build; the full log goes to ${OUT:-build-gpu}.
#
# usage: scripts/gpu-test.sh [--no-build] [--gpu-only] [-- extra ctest args, e.g. -R gpu.pool]
# env:   OUT (where the log and test artefacts go), VMMCKPT_COMMIT (the commit id to report; default git's),
#        VMMCKPT_GPU_BUILD_DIR (default build-gpu), VMMCKPT_TEST_PYTHON (python with PyTorch).
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}" || exit 1
build_dir="${VMMCKPT_GPU_BUILD_DIR:-build-gpu}"
out_dir="${OUT:-${build_dir}}"
mkdir -p "${out_dir}" "${build_dir}"
log="${out_dir}/gpu-test.log"

do_build=1
cpu_tests=1
ctest_extra=()
while (($#)); do
  case "$1" in
    --no-build) do_build=0 ;;
    --gpu-only) cpu_tests=0 ;;
    --) shift; ctest_extra=("$@"); break ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "gpu-test.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# NVLink SHARP multicast must stay off on the shared machines, for anything we start.
export NCCL_NVLS_ENABLE=0
# CRIU for the whole-process checks, when scripts/provision-criu.sh put it in the carried .deps/.
if [[ -z "${VMMCKPT_CRIU:-}" && -x "${repo_root}/.deps/criu/bin/criu" ]]; then
  export VMMCKPT_CRIU="${repo_root}/.deps/criu/bin/criu"
fi

section() { printf '\n===== %s =====\n' "$*"; }

commit_id() {
  local id
  # A copy of the tree (a GPU machine's) may carry a stale .git: an id given explicitly wins.
  if [[ -n "${VMMCKPT_COMMIT:-}" ]]; then echo "${VMMCKPT_COMMIT}"; return; fi
  if id="$(git -C "${repo_root}" rev-parse --short HEAD 2>/dev/null)"; then
    if [[ -n "$(git -C "${repo_root}" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
      id="${id}-dirty"
    fi
    echo "${id}"
  else
    echo "${VMMCKPT_COMMIT:-unknown}"
  fi
}

# Prints the per-test table from ctest output files: name, status, seconds, harness summary. Every test of
# the first file (the gpu tests, run with -V); of the others (the ~250 CPU tests) only those that did not
# pass, and a count.
summarize() {
  python3 - "$@" <<'PY'
import re, sys
# Test names may hold spaces (one ctest test per Catch2 test case): the name ends at the run of dots.
result_re = re.compile(r"^\s*(?:\d+/\d+ )?Test\s+#(\d+): (.+?) \.+\s*(?:\*+)?([A-Za-z][A-Za-z ]*?)\s+([0-9.]+) sec")
detail_re = re.compile(r"^(\d+): (PASS|FAIL|SKIP|SKIPPED:?) ?(.*)$")
rows, details, shown = [], {}, []
for i, path in enumerate(sys.argv[1:]):
    try:
        text = open(path, errors="replace").read()
    except OSError:
        continue
    for line in text.splitlines():
        m = detail_re.match(line)
        if m:
            details[m.group(1)] = (m.group(2) + " " + m.group(3)).strip()
        m = result_re.match(line)
        if m:
            row = (m.group(1), m.group(2), m.group(3).strip(), m.group(4))
            rows.append(row)
            if i == 0 or row[2] != "Passed":
                shown.append(row)
if not rows:
    print("(no test results found)")
    sys.exit(0)
width = max(len(r[1]) for r in shown) if shown else 4
print(f"{'test':<{width}}  {'status':<9} {'sec':>7}  detail")
for num, name, status, secs in shown:
    detail = details.get(num, "")
    # Strip the repeated test name from the harness line to keep the table narrow.
    detail = re.sub(r"^(PASS|FAIL|SKIP) \S+: ", r"\1: ", detail)
    print(f"{name:<{width}}  {status:<9} {secs:>7}  {detail[:150]}")
counts = {}
for r in rows:
    counts[r[2]] = counts.get(r[2], 0) + 1
if len(shown) < len(rows):
    print(f"(and {len(rows) - len(shown)} CPU tests that passed)")
print("totals: " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items())))
PY
}

main() {
  local status=0 started
  started=$(date +%s)
  section "vmmckpt GPU test run"
  echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host:    $(hostname)"
  echo "commit:  $(commit_id)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv,noheader \
      | sed 's/^/gpu:     /'
    nvidia-smi | sed -n '1,4p'
  else
    echo "gpu:     nvidia-smi not found: the gpu tests will report SKIPPED"
  fi
  local nvcc=nvcc
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc=/usr/local/cuda/bin/nvcc
  fi
  echo "nvcc:    $("${nvcc}" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
  echo "cmake:   $(cmake --version | head -1)"
  echo "python:  $(python3 --version 2>&1)"

  if [[ -d "${repo_root}/.deps/prefix/usr/include" ]]; then
    export VMMCKPT_DEPS_PREFIX="${repo_root}/.deps/prefix"
    echo "deps:    ${VMMCKPT_DEPS_PREFIX}"
  else
    echo "deps:    system (no .deps/prefix; run scripts/fetch-deps.sh on a Debian machine if the configure fails)"
  fi

  if ((do_build)); then
    section "configure"
    local cmake_args=(-S . -B "${build_dir}" -DVMMCKPT_GPU_TESTS=ON)
    command -v ninja >/dev/null && [[ ! -f "${build_dir}/CMakeCache.txt" ]] && cmake_args+=(-G Ninja)
    [[ "${nvcc}" != nvcc ]] && cmake_args+=(-DCMAKE_CUDA_COMPILER="${nvcc}")
    # The python3 on PATH is the one that has PyTorch on the GPU machine; CMake might find another.
    local test_python="${VMMCKPT_TEST_PYTHON:-$(command -v python3)}"
    [[ -n "${test_python}" ]] && cmake_args+=(-DVMMCKPT_TEST_PYTHON="${test_python}")
    if ! cmake "${cmake_args[@]}"; then
      echo "RESULT: configure failed"
      return 1
    fi
    section "build"
    local build_start
    build_start=$(date +%s)
    if ! cmake --build "${build_dir}" -j "$(nproc)"; then
      echo "RESULT: build failed"
      return 1
    fi
    echo "build took $(( $(date +%s) - build_start )) s"
  fi

  # JUnit files for tools that want them (ctest >= 3.21 only); relative paths would land in the
  # build folder, so make them absolute.
  local out_abs gpu_junit=() cpu_junit=()
  out_abs="$(realpath -m "${out_dir}")"
  if ctest --help 2>/dev/null | grep -q -- --output-junit; then
    gpu_junit=(--output-junit "${out_abs}/ctest-gpu.xml")
    cpu_junit=(--output-junit "${out_abs}/ctest-cpu.xml")
  fi

  section "gpu tests (ctest -L gpu)"
  local gpu_out="${out_dir}/ctest-gpu.txt" cpu_out="${out_dir}/ctest-cpu.txt"
  # -V: the harness prints one PASS line with counts per test; the summary table shows it.
  (cd "${build_dir}" && ctest -L gpu -V "${gpu_junit[@]}" "${ctest_extra[@]}") 2>&1 |
    tee "${gpu_out}"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

  if ((cpu_tests)); then
    section "tests that need no GPU (ctest -LE gpu)"
    (cd "${build_dir}" && ctest -LE gpu -j "$(nproc)" --output-on-failure "${cpu_junit[@]}" \
        "${ctest_extra[@]}") 2>&1 | tee "${cpu_out}"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi

  # Keep the harness's per-run stdout/stderr with the log when OUT is a separate folder; one
  # tarball, because the device runner brings back only a handful of files.
  if [[ "${out_abs}" != "$(realpath -m "${build_dir}")" ]]; then
    [[ -d "${build_dir}/tests/gpu/logs" ]] &&
      tar -C "${build_dir}/tests/gpu" -czf "${out_dir}/gpu-logs.tar.gz" logs
    [[ -f "${build_dir}/Testing/Temporary/LastTest.log" ]] &&
      cp "${build_dir}/Testing/Temporary/LastTest.log" "${out_dir}/LastTest-cpu.log"
  fi

  section "summary ($(commit_id), $(( $(date +%s) - started )) s)"
  summarize "${gpu_out}" "${cpu_out}"
  if ((status)); then echo "RESULT: FAILED"; else echo "RESULT: all tests passed or skipped"; fi
  return "${status}"
}

main 2>&1 | tee "${log}"
rc=${PIPESTATUS[0]}
echo "log: ${log}"
exit "${rc}"
