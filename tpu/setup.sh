#!/usr/bin/env bash
# Ship this checkout's committed files (git archive HEAD: no .venv, runs/ or other untracked
# files) to every worker, unpacked into ~/tx (replacing an earlier copy), and install tx there
# with TPU support (pip install '.[tpu]': jax[tpu] and gcsfs for gs:// workdirs).
# Needs PROJECT, ZONE, TPU_NAME. Uncommitted changes are not shipped: commit them first.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! git -C "$root" diff --quiet HEAD 2>/dev/null; then
  echo "warning: uncommitted changes in $root are not shipped (git archive HEAD)" >&2
fi
archive="${TMPDIR:-/tmp}/tx-$(git -C "$root" rev-parse --short HEAD).tar.gz"
run git -C "$root" archive --format=tar.gz --output="$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME":~/tx.tar.gz --zone="$ZONE" \
  --project="$PROJECT" --worker=all
ssh_all "rm -rf ~/tx && mkdir ~/tx && tar -xzf ~/tx.tar.gz -C ~/tx && cd ~/tx && python3 -m pip install -q '.[tpu]'"
