#!/usr/bin/env bash
# Shared by the tpu/ scripts: argument parsing, required variables, dry runs.
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

ssh_all() {  # ssh_all COMMAND: the same command on every worker of the slice
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
    --worker=all --command="$1"
}
