#!/usr/bin/env bash
# Shared by the tpu/ scripts: argument parsing, required variables, dry runs (tpu/README.md).
# DRY_RUN=1 (or --dry-run) prints the commands without running them; any other value runs them.
set -euo pipefail

DRY_RUN=${DRY_RUN:-0}
SPOT=0
QUEUED=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --spot) SPOT=1 ;;
    --queued) QUEUED=1 ;;
    *) echo "error: unknown argument $arg (known: --dry-run --spot --queued)" >&2; exit 2 ;;
  esac
done

# require VAR...: fail with a message naming every missing variable.
require() {
  local missing=()
  for v in "$@"; do [[ -n "${!v:-}" ]] || missing+=("$v"); done
  if ((${#missing[@]})); then
    echo "error: set ${missing[*]} (see tpu/README.md)" >&2
    exit 2
  fi
}

# run CMD...: print the command; execute it unless this is a dry run.
run() {
  printf '+ %s\n' "$*"
  if [[ "$DRY_RUN" != 1 ]]; then "$@"; fi
}

ssh_worker() {  # ssh_worker WORKER COMMAND: COMMAND on one worker (0, 1, ...) or on all
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
    --worker="$1" --command="$2"
}

ssh_all() {  # ssh_all COMMAND: the same command on every worker of the slice
  ssh_worker all "$1"
}

# tx_args: --config CONFIG --workdir WORKDIR, quoted for the remote shell, then EXTRA_ARGS as
# given (several options, split by that shell).
tx_args() {
  printf -- '--config %q --workdir %q' "$CONFIG" "$WORKDIR"
  if [[ -n "${EXTRA_ARGS:-}" ]]; then printf ' %s' "$EXTRA_ARGS"; fi
}
