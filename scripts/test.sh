#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test that needs no GPU (labels unit, emu, harness).
# Usage: scripts/test.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

vmmckpt_install_packages
vmmckpt_check_cuda_toolkit
vmmckpt_build build

echo "==> running the tests that need no GPU"
# --no-tests=error: a run in which no test ran is a failure, not a pass.
ctest --test-dir build --label-exclude gpu --output-on-failure --no-tests=error "$@"
