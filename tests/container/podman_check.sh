#!/usr/bin/env bash
# A container checkpointed and restored by Podman, with the CRIU plugin taking its GPU side (docs/containers.md):
#   podman_check.sh BUILD SOURCE
# emu_ticker runs under the shim on the emulated driver inside a container (the build's bin/, lib/ and test
# programs bind-mounted read-only); `podman container checkpoint` ends it, `podman container restore` brings it
# back, twice (the second checkpoint goes into the directory the first one left), and every tick after each
# restore must find its GPU buffers matching its CPU counter (the ticker checks and logs "BAD" otherwise).
# Skips (exit 77, one line on stdout saying why) when this is not root, when Podman, a runtime that checkpoints
# (runc, or a crun built with CRIU) or CRIU 4 is missing, or when Podman cannot run or checkpoint a plain
# container here. Leaves no container and no configuration behind: an /etc/criu file it needs is put back as
# it was.
set -euo pipefail

build="$(realpath "$1")"
source_dir="$(realpath "$2")"
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || skip "podman container checkpoint runs CRIU, which needs root"
command -v podman >/dev/null || skip "podman is not installed (apt-get install podman runc)"

# The OCI runtime: Debian 12's crun is built without CRIU (no `crun checkpoint`), so runc where it is there.
runtime=""
if command -v runc >/dev/null; then
  runtime=runc
elif command -v crun >/dev/null && crun --version 2>/dev/null | grep -q '+CRIU'; then
  runtime=crun
fi
[[ -n $runtime ]] || skip "no OCI runtime that checkpoints: runc is not installed and crun $(crun --version 2>/dev/null | sed -n 's/^crun version //p') is built without CRIU"

# CRIU 4 (the plugin's hooks): $VMMCKPT_CRIU, else the one scripts/provision-criu.sh put in .deps/, else PATH's.
criu="${VMMCKPT_CRIU:-}"
[[ -n $criu ]] || { [[ -x $source_dir/.deps/criu/bin/criu ]] && criu="$source_dir/.deps/criu/bin/criu"; } || true
[[ -n $criu ]] || criu="$(command -v criu || true)"
[[ -n $criu ]] || skip "no CRIU 4: run scripts/provision-criu.sh, or set VMMCKPT_CRIU"
criu_version="$("$criu" --version 2>/dev/null | sed -n 's/^Version: *//p')"
[[ ${criu_version%%.*} -ge 4 ]] 2>/dev/null || skip "CRIU $criu is version '${criu_version}', the plugin needs 4 or later"

for f in bin/cuda-ckpt lib/libvmmckpt.so lib/criu/vmmckpt_criu.so lib/emu/libcuda.so.1 tests/programs/emu_ticker; do
  [[ -e $build/$f ]] || fail "$build/$f is not built"
done

scratch="$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/vmmckpt-podman.XXXXXX")")"
name="vmmckpt-podman-check-$$"
probe="$name-probe"
made_etc_criu=0
configs=()
cleanup() {
  local c
  for c in "$name" "$probe"; do podman rm -f -i -t 0 "$c" >/dev/null 2>&1 || true; done
  for c in "${configs[@]}"; do
    if [[ -e $scratch/saved/$c ]]; then cp -p "$scratch/saved/$c" "/etc/criu/$c"; else rm -f "/etc/criu/$c"; fi
  done
  [[ $made_etc_criu -eq 0 ]] || rmdir /etc/criu 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT

# Podman finds CRIU on PATH (its version check, and the runtime's `criu swrk`): ours first, told where the
# emulated driver is (CRIU runs through its own loader, which ignores LD_LIBRARY_PATH).
mkdir -p "$scratch/path" "$scratch/saved" "$scratch/share"
cat >"$scratch/path/criu" <<EOF
#!/bin/sh
export VMMCKPT_LIBCUDA='$build/lib/emu/libcuda.so.1'
exec '$criu' "\$@"
EOF
chmod +x "$scratch/path/criu"
export PATH="$scratch/path:$PATH"

# The runtime runs CRIU with its own configuration file (runc: /etc/criu/runc.conf; crun: crun.conf): it names
# the plugin's directory. An existing file keeps its lines and is put back afterwards.
[[ -d /etc/criu ]] || { mkdir /etc/criu; made_etc_criu=1; }
for c in runc.conf crun.conf; do
  [[ ! -e /etc/criu/$c ]] || cp -p "/etc/criu/$c" "$scratch/saved/$c"
  configs+=("$c")
  { [[ ! -e $scratch/saved/$c ]] || cat "$scratch/saved/$c"; echo "libdir $build/lib/criu"; } >"/etc/criu/$c"
done

# The container's root: the host's /usr, read-only, and nothing else; no image, no registry.
root="$scratch/root"
mkdir -p "$root"/{usr,tmp,proc,dev,sys,etc}
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$root/$l"; done
# Limits at or below this process's own (the runtime sets them; raising one needs CAP_SYS_RESOURCE).
limit() { local v; v="$(ulimit -H "$1")"; [[ $v == unlimited || $v -gt $2 ]] && v=$2; echo "$v"; }
nofile="$(limit -n 65536)"
nproc="$(limit -u 32768)"
common=(--runtime "$runtime" --network none --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc"
        -v /usr:/usr:ro)
last_line() { grep -v '^\s*$' "$1" | tail -n 1; }

# Can a container run here, and can Podman checkpoint and restore one at all (no GPU, no plugin)?
if ! podman run -d --name "$probe" "${common[@]}" --rootfs "$root" /bin/sh -c 'while :; do sleep 0.1; done' \
    >"$scratch/probe.out" 2>&1; then
  skip "podman $(podman --version | awk '{print $3}') cannot run a container here: $(last_line "$scratch/probe.out")"
fi
if ! podman container checkpoint "$probe" >"$scratch/probe.out" 2>&1; then
  skip "podman $(podman --version | awk '{print $3}') cannot checkpoint a container here ($runtime, CRIU $criu_version): $(last_line "$scratch/probe.out")"
fi
if ! podman container restore "$probe" >"$scratch/probe.out" 2>&1; then
  skip "podman $(podman --version | awk '{print $3}') cannot restore a checkpointed container here ($runtime, CRIU $criu_version): $(last_line "$scratch/probe.out")"
fi
podman rm -f -t 0 "$probe" >/dev/null 2>&1

# The ticker in a container. The suspend image lies in the checkpoint directory Podman gives CRIU, under its
# storage: the program writes it there and reads it back, so that directory is mounted into the container at
# the same path (docs/containers.md: the image directory must be seen from both sides).
storage="$(podman info --format '{{.Store.GraphRoot}}')/overlay-containers"
log="$scratch/share/log"
podman run -d --name "$name" "${common[@]}" \
  -v "$build/bin:$build/bin:ro" -v "$build/lib:$build/lib:ro" -v "$build/tests/programs:$build/tests/programs:ro" \
  -v "$scratch/share:$scratch/share" -v "$storage:$storage" -e "LD_LIBRARY_PATH=$build/lib/emu" \
  --rootfs "$root" "$build/bin/cuda-ckpt" run -- "$build/tests/programs/emu_ticker" "$log" >/dev/null
checkpoint_dir="$(podman inspect "$name" --format '{{.StaticDir}}')/checkpoint"

last_tick() { { grep '^tick ' "$log" 2>/dev/null || true; } | tail -n 1 | awk '{print $2+0}'; }
# ticks_reach N: the ticker's log reaches tick N within a minute.
ticks_reach() {
  local i
  for i in $(seq 600); do
    [[ $(last_tick) -ge $1 ]] && return 0
    sleep 0.1
  done
  return 1
}
explain() {
  local d
  d="$(dirname "$checkpoint_dir")"
  echo "--- podman logs"; podman logs "$name" 2>&1 | tail -n 20 || true
  echo "--- CRIU's logs"; grep -hE 'vmmckpt|Error' "$d/dump.log" "$d/restore.log" 2>/dev/null | tail -n 20 || true
  echo "--- the plugin's"; cat /tmp/vmmckpt-criu-*.log 2>/dev/null | tail -n 5 || true
  echo "--- cuda-ckpt ps"; "$build/bin/cuda-ckpt" ps 2>&1 | tail -n 5 || true
  echo "--- the ticker's log"; tail -n 5 "$log" || true
}
ticks_reach 3 || { explain; fail "the ticker did not start ticking in its container"; }

for round in 1 2; do
  podman container checkpoint --keep "$name" >"$scratch/checkpoint.out" 2>&1 ||
    { cat "$scratch/checkpoint.out"; explain; fail "podman container checkpoint failed (round $round)"; }
  [[ $(podman inspect "$name" --format '{{.State.Status}}') == exited ]] || fail "the container still runs after its checkpoint"
  at="$(last_tick)"
  part="$checkpoint_dir/vmmckpt/1"  # named by the program's pid in the container, which CRIU restores
  [[ -d $part ]] || { ls "$checkpoint_dir" "$checkpoint_dir/vmmckpt" || true; fail "no GPU part $part in Podman's checkpoint"; }
  "$build/bin/cuda-ckpt" verify "$part" >"$scratch/verify.out" 2>&1 ||
    { cat "$scratch/verify.out"; fail "the GPU part of the checkpoint does not verify"; }
  sleep 0.5
  [[ $(last_tick) -eq $at ]] || fail "the ticker went on after its checkpoint (tick $at, then $(last_tick))"

  podman container restore --keep "$name" >"$scratch/restore.out" 2>&1 ||
    { cat "$scratch/restore.out"; explain; fail "podman container restore failed (round $round)"; }
  ticks_reach $((at + 5)) || { explain; fail "the restored ticker does not tick on past $at (round $round)"; }
  ! grep -q '^BAD' "$log" || { explain; fail "the restored ticker's GPU buffers do not match its counter: $(grep -m1 '^BAD' "$log")"; }
  echo "round $round: checkpointed at tick $at with its GPU part ($(du -sh "$part" | cut -f1)), restored, ticking on at $(last_tick)"
done

# The ticker stops when asked and exits 0 only when its buffers still hold at the end.
touch "$log.stop"
status="$(podman wait "$name" 2>/dev/null || echo unknown)"
[[ $status == 0 ]] || { explain; fail "the ticker ended with status $status"; }
grep -q '^stopped at' "$log" || fail "the ticker did not log its stop"
echo "podman $(podman --version | awk '{print $3}') ($runtime, CRIU $criu_version): checkpoint and restore, twice, with the GPU side through vmmckpt_criu.so"
