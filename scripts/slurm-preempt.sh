#!/usr/bin/env bash
# Runs a CUDA program under vmmckpt in a Slurm job that may be preempted or hit its time limit: on the
# warning signal the whole process is dumped (cuda-ckpt dump --process) and the job requeued; the next
# allocation restores it (cuda-ckpt restore DIR) instead of starting it again. docs/whole-process.md.
#
# In the batch script:
#   #SBATCH --signal=B:USR1@120     # USR1 to the batch shell 120 s before the end
#   #SBATCH --requeue
#   exec scripts/slurm-preempt.sh --image-dir "$SCRATCH/ckpt/$SLURM_JOB_NAME" -- python train.py
# A step of several ranks on the node (torchrun, mpirun): --job, and the whole job is dumped at one point of all
# its ranks (cuda-ckpt dump --job --process, docs/job-checkpoint.md):
#   exec scripts/slurm-preempt.sh --job --image-dir "$SCRATCH/ckpt/$SLURM_JOB_NAME" -- \
#       torchrun --nproc-per-node 8 train.py
#
# usage: slurm-preempt.sh --image-dir DIR [--job] [--output FILE] [--signal SIG] -- COMMAND [ARGS...]
#   --image-dir DIR  where the image lives between allocations (DIR/image; shared storage for another node)
#   --job            COMMAND launches a multi-rank job: its ranks are cut at one point and dumped together
#   --output FILE    the program's stdout and stderr (default DIR/output.log, appended)
#   --signal SIG     the warning signal (default USR1)
# Exit: the program's end (0 when it ended by itself; its status when it was started here), 0 after a
# checkpoint and requeue, 1 when the checkpoint failed (the program then goes on until Slurm ends it).
# Needs root for CRIU. CUDA_CKPT names cuda-ckpt (default: the one on PATH).
set -uo pipefail

image_dir="" output="" sig=USR1 job=()
while (($#)); do
  case "$1" in
    --image-dir) image_dir="$2"; shift ;;
    --job) job=(--job) ;;
    --output) output="$2"; shift ;;
    --signal) sig="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "slurm-preempt: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$image_dir" && $# -gt 0 ]] || { echo "slurm-preempt: usage: slurm-preempt.sh --image-dir DIR -- COMMAND [ARGS...]" >&2; exit 2; }
cuda_ckpt="${CUDA_CKPT:-cuda-ckpt}"
image="$image_dir/image"
output="${output:-$image_dir/output.log}"
mkdir -p "$image_dir"
log() { printf 'slurm-preempt: %s\n' "$*" >&2; }

pid="" started_here=0
if [[ -d "$image" ]]; then
  # A requeued job: the program comes back as it was at the checkpoint.
  pid="$("$cuda_ckpt" restore "$image")" || { log "restore of $image failed (above); the image is kept"; exit 1; }
  log "restored process $pid from $image"
else
  # Its own session, stdio on a file: what CRIU dumps and restores whole.
  setsid "$cuda_ckpt" run -- "$@" >>"$output" 2>&1 </dev/null &
  pid=$!
  started_here=1
  log "started process $pid: $*"
fi

checkpoint() {
  log "$sig: dumping ${job:+the job of }process $pid whole into $image"
  rm -rf "$image.new"
  if ! "$cuda_ckpt" dump ${job[@]+"${job[@]}"} "$pid" --process -o "$image.new" >&2; then
    log "the checkpoint failed (above); the program goes on"
    trap - "$sig"
    return 1
  fi
  # The new image replaces the last one only once complete.
  rm -rf "$image.old"
  [[ -d "$image" ]] && mv "$image" "$image.old"
  mv "$image.new" "$image" && rm -rf "$image.old"
  if [[ -n "${SLURM_JOB_ID:-}" ]] && command -v scontrol >/dev/null; then
    scontrol requeue "$SLURM_JOB_ID" && log "requeued job $SLURM_JOB_ID: the next allocation restores it"
  else
    log "not in a Slurm job: run this script again to restore it"
  fi
  exit 0
}
trap checkpoint "$sig"

# Waiting in short sleeps lets the trap run as soon as the signal comes (bash runs traps between
# commands). An ended program is a zombie until its parent reaps it: this script, or for a restored one
# whoever CRIU left it to.
while kill -0 "$pid" 2>/dev/null && [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" != Z* ]]; do
  sleep 0.2 &
  wait $! 2>/dev/null
done
status=0
if ((started_here)); then wait "$pid"; status=$?; fi
log "process $pid ended (status $status); the job is done: removing its image"
rm -rf "$image" "$image.old" "$image.new"
exit "$status"
