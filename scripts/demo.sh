#!/usr/bin/env bash
# The main job, end to end: installs what is missing, builds, and runs the demo program under vmmckpt,
# on the GPU when there is one, on the emulated driver otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

vmmckpt_install_packages
vmmckpt_check_cuda_toolkit
vmmckpt_build build >/dev/null
echo "==> built build/lib/libvmmckpt.so and build/bin/cuda-ckpt"

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
echo "demo OK: the addresses are fixed, so a later dump can be restored at the same addresses."
