#!/usr/bin/env bash
# Formats the C and C++ sources with clang-format and the repository's .clang-format.
# Usage: scripts/format.sh [--check] [FILE...]
#   --check  change nothing: list the files that would change and exit 1 if there is any
# Without FILE, every tracked .cpp, .hpp, .h, .c and .cu file. The .inc entry point lists are left alone: they are
# generated (shim/gen/) and the build reads them one entry a line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/setup.sh

check=0
files=()
while (($#)); do
  case "$1" in
    --check) check=1; shift ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "error: unknown option '$1' (usage: scripts/format.sh [--check] [FILE...])" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done

VMMCKPT_NEEDS+=("cmd:clang-format|clang-format")
vmmckpt_install_packages

if ((${#files[@]} == 0)); then
  mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.h' '*.c' '*.cu')
fi

if ((check)); then
  changed=()
  for f in "${files[@]}"; do
    clang-format --style=file "$f" | cmp -s - "$f" || changed+=("$f")
  done
  if ((${#changed[@]})); then
    printf '%s\n' "${changed[@]}"
    echo "format: ${#changed[@]} of ${#files[@]} files would change (scripts/format.sh formats them)" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files, all formatted"
else
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 -P "$(nproc)" clang-format --style=file -i
  echo "format: ${#files[@]} files formatted"
fi
