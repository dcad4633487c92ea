#!/usr/bin/env bash
# Static analysis: clang-tidy, with the checks of .clang-tidy, over the product's C++ sources (shim, ckpt,
# restore, common, tools, criu; not the tests, the emulated driver, the benchmarks or the .cu kernels).
# Usage: scripts/lint.sh [FILE...]   (default: every .cpp of those directories)
# Configures build-lint/ (compile commands only: nothing is compiled) and exits 1 on any finding, each shown
# once. About 7 minutes on two cores. env: VMMCKPT_LINT_JOBS (clang-tidy processes at a time, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

VMMCKPT_NEEDS+=("cmd:clang-tidy|clang-tidy")
vmmckpt_install_packages
vmmckpt_check_cuda_toolkit

build=build-lint
start=$SECONDS
echo "==> configuring $build (compile commands for clang-tidy)"
# Without -Werror whatever the environment says: clang's own warnings are not what this checks.
vmmckpt_configure "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DVMMCKPT_WERROR=OFF >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
rm -f "$build.configure.log"

# One compile command per product source, in a database of its own: the unit tests compile some of the same
# files again (linting them twice would double the time), and nvcc's commands are not clang's to read. A
# source's own library's command is preferred to a test's.
db="$build/tidy"
mkdir -p "$db"
mapfile -t files < <(python3 - "$build/compile_commands.json" "$db/compile_commands.json" "$PWD" "$@" <<'EOF'
import json, os, sys
source, target, root, wanted = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
dirs = ("shim", "ckpt", "restore", "common", "tools", "criu")
wanted = {os.path.abspath(w) for w in wanted}
chosen = {}
for entry in json.load(open(source)):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if not path.endswith(".cpp") or rel.split(os.sep)[0] not in dirs:
        continue
    if wanted and path not in wanted:
        continue
    command = entry.get("command") or " ".join(entry["arguments"])
    from_tests = " -o tests/" in command
    if path not in chosen or (chosen[path]["from_tests"] and not from_tests):
        chosen[path] = {"directory": entry["directory"], "file": path, "command": command, "from_tests": from_tests}
for entry in chosen.values():
    del entry["from_tests"]
missing = wanted - set(chosen)
if missing:
    sys.exit("not a product source with a compile command: " + " ".join(sorted(missing)))
json.dump(list(chosen.values()), open(target, "w"), indent=1)
print("\n".join(sorted(chosen)))
EOF
)
((${#files[@]})) || { echo "error: no sources to lint" >&2; exit 1; }

jobs="${VMMCKPT_LINT_JOBS:-$(nproc)}"
echo "==> clang-tidy on ${#files[@]} sources ($jobs at a time; checks: .clang-tidy)"
logs="$build/tidy/logs"
rm -rf "$logs"
mkdir -p "$logs"
# Each file's output in a log of its own, shown only when that file has findings (or does not compile).
printf '%s\0' "${files[@]}" | xargs -0 -n 1 -P "$jobs" bash -c '
  log="$1/$(printf %s "$3" | tr / _).log"
  clang-tidy -p "$2" --quiet "$3" >"$log" 2>&1 || echo "$3" >>"$1/failed"' _ "$logs" "$db"

if [ -s "$logs/failed" ]; then
  mapfile -t failed < <(sort "$logs/failed")
  # Each finding once: one in a header shows in the log of every source that includes it.
  for f in "${failed[@]}"; do printf '%s\n' "$logs/$(printf %s "$f" | tr / _).log"; done | python3 -c '
import re, sys
start = re.compile(r"^\S+:\d+:\d+: (warning|error|fatal error): |^Error while processing ")
seen, block = set(), []
def flush():
    if block and block[0] not in seen:
        seen.add(block[0])
        print("\n".join(block))
for log in sys.stdin.read().split():
    for line in open(log, errors="replace").read().splitlines():
        if re.match(r"^\d+ (warnings?|errors?)( and \d+ (warnings?|errors?))? generated\.$", line):
            continue
        if start.match(line):
            flush()
            block = []
        block.append(line)
    flush()
    block = []
'
  echo "lint FAILED: findings in ${#failed[@]} of ${#files[@]} sources (${failed[*]#"$PWD"/}), $((SECONDS - start)) s" >&2
  exit 1
fi
echo "lint passed: ${#files[@]} sources, no findings, $((SECONDS - start)) s"
