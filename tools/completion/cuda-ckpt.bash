# Bash completion for cuda-ckpt: subcommands, their options, pids of running processes and image directories.
# Kept by hand; tests/install/install_check.sh fails when a subcommand of `cuda-ckpt --help` is missing here.

_cuda_ckpt() {
  local cur prev words cword
  _init_completion 2>/dev/null || {
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  }
  local subcommands="run ps check dump inspect verify cat peek poke merge rm gc suspend resume job-agent restore help"

  # The subcommand is the first word after cuda-ckpt that is not an option.
  local i sub=""
  for ((i = 1; i < cword; i++)); do
    case "${words[i]}" in
      -*) ;;
      *) sub="${words[i]}"; break ;;
    esac
  done

  if [[ -z "$sub" ]]; then
    COMPREPLY=($(compgen -W "$subcommands --help --version" -- "$cur"))
    return
  fi
  # `cuda-ckpt help COMMAND`: the command whose help to print.
  if [[ "$sub" == help ]]; then
    COMPREPLY=($(compgen -W "${subcommands% help}" -- "$cur"))
    return
  fi

  # run and restore hand everything after "--" to the command they start.
  for ((i = 2; i < cword; i++)); do
    if [[ "${words[i]}" == "--" && ( "$sub" == run || "$sub" == restore ) ]]; then
      COMPREPLY=($(compgen -c -- "$cur"))
      return
    fi
  done

  local options=""
  case "$sub" in
    run) options="--help --" ;;
    ps) options="--help --json -t --pid" ;;
    check) options="--help --json -t --pid" ;;
    dump) options="--help -o --output -D --json --deadline --chunk --staging --pinned --streams --no-gpu-snapshot
                   --allow-partial --parent --cpu-checksums --writers -t --pid --process --leave-running --pre-copy --criu-arg
                   --every --count --full-every --job --ranks --nodes --token-file" ;;
    inspect | verify) options="--help --json -D" ;;
    cat) options="--help -o --output -D" ;;
    merge) options="--help -o --output -D --json" ;;
    rm) options="--help --force --json -D" ;;
    gc) options="--help --dry-run --json" ;;
    suspend) options="--help -o --output -D --json --deadline --verify --allow-partial --parent --cpu-checksums --writers -t --pid
                      --job --ranks" ;;
    resume) options="--help --json -t --pid --job --ranks --deadline" ;;
    job-agent) options="--help --ranks --listen --token-file -t --pid" ;;
    restore) options="--help --replay --no-verify --device -D --json --criu-arg --" ;;
  esac

  case "$prev" in
    -o | --output | -D | --parent) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --token-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    -t | --pid) COMPREPLY=($(compgen -W "$(ls /proc | grep -E '^[0-9]+$')" -- "$cur")); return ;;
    --deadline | --chunk | --staging | --pinned | --streams | --writers | --device | --criu-arg | --ranks | --nodes | --listen) return ;;
  esac

  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$options" -- "$cur"))
    return
  fi
  case "$sub" in
    # Any pid; cuda-ckpt ps would say which run under vmmckpt, but it may be slow to ask.
    check | dump | suspend | resume | ps | job-agent) COMPREPLY=($(compgen -W "$(ls /proc | grep -E '^[0-9]+$')" -- "$cur")) ;;
    inspect | verify | cat | merge | rm | restore | gc) COMPREPLY=($(compgen -d -- "$cur")) ;;
    run) COMPREPLY=($(compgen -c -- "$cur")) ;;
  esac
}
complete -F _cuda_ckpt cuda-ckpt
