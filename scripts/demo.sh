#!/usr/bin/env bash
# The main job, end to end: installs what is missing, builds, and runs the demo program under vmmckpt,
# on the GPU when there is one, on the emulated driver otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

vmmckpt_install_packages
vmmckpt_check_cuda_toolkit
# Only what the demo runs: the shim, the tool, the demo program and the emulated driver (127 of the project's
# 265 build steps; about 9 minutes the first time on two cores, seconds after: README.md). The tests are built by
# scripts/test.sh.
targets=(vmmckpt cuda-ckpt vmmckpt-demo-app)
vmmckpt_has_gpu || targets+=(vmmckpt_emu)
echo "==> configuring build/"
vmmckpt_configure build | grep -E '^-- (Configuring done|Build files)' || true
echo "==> building ${targets[*]} (the first time takes minutes: the steps count up below)"
started=$(date +%s)
vmmckpt_build_targets build "${targets[@]}"
echo "==> built build/lib/libvmmckpt.so and build/bin/cuda-ckpt in $(( $(date +%s) - started )) s"

if vmmckpt_has_gpu; then
  echo "==> GPU found: running on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
else
  echo "==> no GPU here: running on the emulated CUDA driver (build/lib/emu/libcuda.so.1)"
  export LD_LIBRARY_PATH="$PWD/build/lib/emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export NCCL_NVLS_ENABLE=0

app=build/bin/vmmckpt-demo-app
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo
echo "==> 1. the demo program without vmmckpt: the driver picks the addresses"
"$app" | tee "$work/native"
echo
echo "==> 2. under vmmckpt (cuda-ckpt run): every buffer lands in the pool at 0x200000000000"
build/bin/cuda-ckpt run -- "$app" | tee "$work/run1"
echo
echo "==> 3. again, in a new process"
build/bin/cuda-ckpt run -- "$app" >"$work/run2"
addresses() { awk 'NR>2 {print $1, $3, $4}' "$1"; }
if diff <(addresses "$work/run1") <(addresses "$work/run2") >/dev/null; then
  echo "same buffers, same addresses, same bytes in both runs:"
  addresses "$work/run2" | sed 's/^/    /'
else
  echo "error: the two runs placed buffers differently:" >&2
  diff <(addresses "$work/run1") <(addresses "$work/run2") >&2 || true
  exit 1
fi
pool_end=$((0x200000000000 + (512 << 30)))
while read -r name addr _; do
  if ((addr < 0x200000000000 || addr >= pool_end)); then
    echo "error: $name at $addr is outside the pool" >&2
    exit 1
  fi
done < <(addresses "$work/run1")

echo
echo "==> 4. the demo program serving (under vmmckpt), as a long-running job would"
build/bin/cuda-ckpt run -- "$app" serve "$work/state" >"$work/serve.out" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do grep -q '^ready' "$work/serve.out" && break; sleep 0.1; done
grep -q '^ready' "$work/serve.out" || { echo "error: the demo program did not start:" >&2; cat "$work/serve.out" >&2; exit 1; }
build/bin/cuda-ckpt ps

echo
echo "==> 5. cuda-ckpt dump $pid: a consistent image while it runs"
build/bin/cuda-ckpt dump "$pid" -o "$work/image"
build/bin/cuda-ckpt verify "$work/image"
build/bin/cuda-ckpt inspect "$work/image" | sed -n '1,6p'

echo
echo "==> 6. cuda-ckpt suspend $pid: its GPU memory freed while it stays alive; then resume"
build/bin/cuda-ckpt suspend "$pid" -o "$work/suspended"
build/bin/cuda-ckpt ps
build/bin/cuda-ckpt resume "$pid"

echo
echo "==> 7. the process is gone; cuda-ckpt restore brings its memory back in a new process"
kill "$pid"
wait "$pid" 2>/dev/null || true
build/bin/cuda-ckpt restore "$work/image" -- "$app" check "$work/state"

echo
echo "demo OK: fixed addresses, a consistent dump of a running process, suspend and resume, and a restore"
echo "that a new process reads at the same addresses with the same bytes."
