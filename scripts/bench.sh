#!/usr/bin/env bash
# Runs vmmckpt's benchmarks (issue #5). On a machine with a GPU: every part (bench/run_bench.py), then
# docs/benchmarks.md and its plots in docs/img/ (bench/report.py), all from that one run. Without a
# GPU, or with --cpu-only: the parts that need none (the pool allocator, host memory and tmpfs limits,
# a dump/suspend/restore round trip on the emulated driver), results in BUILD/results-cpu and a summary
# printed; docs/ is not touched.
#
# usage: scripts/bench.sh [--quick] [--sizes 1,4,16,32] [--skip PARTS] [--out DIR] [--cpu-only]
#                         [--append] [--report-only] [--md PATH] [--img-dir DIR] [--build DIR]
#   --quick        sizes 1,4 and fewer iterations
#   --skip PARTS   limits,dump,many,driver,process,incremental,alloc,launch,torch,vmm,frag,peer
#                  (peer: a copy of 1 GiB between two GPUs, skipped with a message on one)
#   --append       add to OUT's results (a run in several parts, e.g. under a time limit per command)
#   --report-only  only make the page from OUT's results
#   --out DIR      results (default BUILD/results, or BUILD/results-cpu)    --build DIR  default build-bench
# env: VMMCKPT_COMMIT (commit id when .git is absent), VMMCKPT_BENCH_PYTHON (python with PyTorch)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

build="build-bench"
out=""
md=docs/benchmarks.md
img_dir=docs/img
cpu_only=0
report_only=0
run_args=()
skip_args=()
while (($#)); do
  case "$1" in
    --quick|--append) run_args+=("$1") ;;
    --cpu-only) cpu_only=1 ;;
    --report-only) report_only=1 ;;
    --sizes|--skip|--out|--md|--img-dir|--build)
      [ $# -ge 2 ] || { echo "bench.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --sizes) run_args+=(--sizes "$2") ;;
        --skip) run_args+=(--skip "$2"); skip_args=(--skip "$2") ;;
        --out) out="$2" ;;
        --md) md="$2" ;;
        --img-dir) img_dir="$2" ;;
        --build) build="$2" ;;
      esac
      shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# NVLink SHARP multicast must stay off on the shared machines, for anything we start.
export NCCL_NVLS_ENABLE=0

# The page needs matplotlib for its plots: the first python that has it makes it.
make_page() {
  local py report_python=python3
  for py in python3 /opt/torch/.venv/bin/python3 ${VMMCKPT_BENCH_PYTHON:-}; do
    if command -v "$py" >/dev/null && "$py" -c 'import matplotlib' 2>/dev/null; then report_python="$py"; break; fi
  done
  "$report_python" bench/report.py --results "$out" --md "$md" --img-dir "$img_dir"
}

if ((report_only)); then
  out="${out:-$build/results}"
  make_page
  exit 0
fi

vmmckpt_install_packages
vmmckpt_check_cuda_toolkit
cmake_args=(-DVMMCKPT_BUILD_TESTS=OFF)
if command -v nvcc >/dev/null || [ -x "$CUDAToolkit_ROOT/bin/nvcc" ]; then
  cmake_args+=(-DVMMCKPT_GPU_BENCH=ON)
else
  echo "==> no nvcc: building the CPU-only benchmarks"
fi
echo "==> building $build (log: $build/build.log)"
mkdir -p "$build"
vmmckpt_build "$build" "${cmake_args[@]}" >"$build/build.log" 2>&1 || { tail -40 "$build/build.log" >&2; exit 1; }

if ((cpu_only == 0)) && ! vmmckpt_has_gpu; then
  echo "==> no GPU here: running the CPU-only part (the emulated driver); docs/ is left as it is"
  cpu_only=1
fi

status=0
if ((cpu_only)); then
  out="${out:-$build/results-cpu}"
  python3 bench/run_bench.py --cpu-only --build "$build" --out "$out" "${skip_args[@]}" || status=$?
else
  [ -x "$build/bin/vmmckpt_bench_fill" ] || { echo "error: the GPU benchmarks need nvcc to build" >&2; exit 1; }
  out="${out:-$build/results}"
  echo "==> GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  [ -n "${VMMCKPT_BENCH_PYTHON:-}" ] && run_args+=(--python "$VMMCKPT_BENCH_PYTHON")
  python3 bench/run_bench.py --build "$build" --out "$out" "${run_args[@]}" || status=$?
  make_page
fi
python3 bench/report.py --results "$out" --text
echo "==> results: $out/results.jsonl (the output of every command: $out/logs)"
((status == 0)) || echo "==> some measurements failed or were skipped: see the ERROR lines above" >&2
exit "$status"
