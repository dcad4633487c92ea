#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test that needs no GPU (labels unit, emu, harness).
# Usage: scripts/test.sh [extra ctest arguments]
# env: VMMCKPT_TEST_JOBS (tests at a time, default twice the cores)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

vmmckpt_install_packages
vmmckpt_check_cuda_toolkit
# CRIU 4.2 for the whole-process tests, as .ci/run does (Debian forky's, into .deps/criu; the system is not
# touched). Optional like CRIU itself: without it those tests show as skipped, and the summary says why.
bash scripts/provision-criu.sh --check >/dev/null 2>&1 || echo "==> CRIU could not be provisioned: the whole-process tests will skip"
vmmckpt_build build

# Several at a time: most end-to-end tests wait on their programs rather than compute. The longest start first:
# ctest orders by the costs of earlier runs, and a fresh build takes them from tests/ctest-costs.txt.
jobs="${VMMCKPT_TEST_JOBS:-$(($(nproc) * 2))}"
costs=build/Testing/Temporary/CTestCostData.txt
if [ ! -s "$costs" ] && [ -f tests/ctest-costs.txt ]; then
  mkdir -p "$(dirname "$costs")"
  cp tests/ctest-costs.txt "$costs"
fi
echo "==> running the tests that need no GPU ($jobs at a time)"
# --no-tests=error: a run in which no test ran is a failure, not a pass.
status=0
ctest --test-dir build --label-exclude gpu --output-on-failure --no-tests=error -j "$jobs" "$@" || status=$?
# What skipped and why: each skipped test prints "SKIPPED: <reason>" (tests/support/skip.hpp), which
# --output-on-failure does not show.
python3 scripts/lib/skipped_tests.py build/Testing/Temporary/LastTest.log || true
exit "$status"
