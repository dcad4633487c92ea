#!/usr/bin/env python3
"""Prints each test that ctest reported as skipped, with the reason it gave ("SKIPPED: ..."), from ctest's
LastTest.log: what `ctest --output-on-failure` does not show. Prints nothing when none skipped."""
import re
import sys


def main(path):
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return 0
    skipped = []
    # LastTest.log: one block per test from `N/M Testing: NAME`, with the test's output; a skipped test says
    # "SKIPPED: <reason>" there (ctest marks it "Test Passed." in this log, skipped in its summary).
    for block in re.split(r"\n(?=\d+/\d+ Testing: )", text):
        head = re.match(r"\d+/\d+ Testing: (.+)", block)
        reason = re.search(r"^SKIPPED:?\s*(.+)$", block, re.MULTILINE)
        if head and reason:
            skipped.append((head.group(1).strip(), reason.group(1).strip()))
    if skipped:
        print(f"==> {len(skipped)} test(s) skipped:")
        for name, reason in skipped:
            print(f"    {name}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/Testing/Temporary/LastTest.log"))
