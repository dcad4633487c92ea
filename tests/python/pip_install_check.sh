#!/usr/bin/env bash
# emu.python.pip_install: `pip install` of the repository into a fresh virtual environment makes the package
# with the project's CMake; the installed package finds its own cuda-ckpt, which finds its own shim, and a
# program under them pauses and resumes itself (api_check.py pause keep). The package takes the suite's own
# build of cuda-ckpt and the shim (VMMCKPT_PREBUILT_DIR) rather than compiling them again, and is built in
# WORK_DIR, from nothing, every time (never in the source tree's build-python/).
# Usage: pip_install_check.sh SOURCE_DIR WORK_DIR BUILD_DIR
# Exit 77 (skipped, with the reason) where no package index is reachable for the build's own requirement.
set -euo pipefail
source_dir="$1"
work="$2"
built="$3"
rm -rf "$work"
mkdir -p "$work"
python3 -m venv "$work/venv" || { echo "SKIP: python3 -m venv is not available (Debian: python3-venv)"; exit 77; }
py="$work/venv/bin/python"
if ! "$py" -m pip download --quiet --no-deps -d "$work/probe" "scikit-build-core>=0.8" >"$work/probe.log" 2>&1; then
  echo "SKIP: no package index reachable for scikit-build-core (pip download failed: $(tail -1 "$work/probe.log"))"
  exit 77
fi
echo "==> pip install $source_dir (cuda-ckpt and the shim from $built)"
"$py" -m pip install --quiet --config-settings=build-dir="$work/build" \
  --config-settings=cmake.define.VMMCKPT_PREBUILT_DIR="$built" "$source_dir"

# Out of the source tree, so that the installed package is the one imported.
cd "$work"
tool=$("$py" -c "import vmmckpt; print(vmmckpt.tool_path())")
case "$tool" in
  "$work"/venv/*) ;;
  *) echo "FAIL: vmmckpt.tool_path() is $tool, not the one installed in the venv"; exit 1 ;;
esac
"$tool" --version
shim=$(dirname "$tool")/../lib/libvmmckpt.so
[ -f "$shim" ] || { echo "FAIL: no shim next to the installed cuda-ckpt ($shim)"; exit 1; }
[ -f "$(dirname "$tool")/../include/vmmckpt/vmmckpt.h" ] || { echo "FAIL: the package lacks vmmckpt.h"; exit 1; }
env -u VMMCKPT_CUDA_CKPT -u VMMCKPT_SHIM -u PYTHONPATH "$py" "$source_dir/tests/python/api_check.py" pause keep
echo "ok: pip install, the installed tool and shim, pause and resume"
