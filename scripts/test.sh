#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test that needs no GPU (labels unit, emu, harness).
# Usage: scripts/test.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

vmmckpt_install_packages
vmmckpt_check_cuda_toolkit
# CRIU 4.2 for the whole-process tests, as .ci/run does (Debian forky's, into .deps/criu; the system is not
# touched). Optional like CRIU itself: without it those tests show as skipped, and the summary says why.
bash scripts/provision-criu.sh --check >/dev/null 2>&1 || echo "==> CRIU could not be provisioned: the whole-process tests will skip"
vmmckpt_build build

echo "==> running the tests that need no GPU"
# --no-tests=error: a run in which no test ran is a failure, not a pass.
status=0
ctest --test-dir build --label-exclude gpu --output-on-failure --no-tests=error "$@" || status=$?
# What skipped and why: each skipped test prints "SKIPPED: <reason>" (tests/support/skip.hpp), which
# --output-on-failure does not show.
python3 scripts/lib/skipped_tests.py build/Testing/Temporary/LastTest.log || true
exit "$status"
