#!/usr/bin/env bash
# Copy this checkout to every worker and install tx with TPU support.
# Needs PROJECT, ZONE, TPU_NAME.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME
root="$(cd "$(dirname "$0")/.." && pwd)"
run gcloud compute tpus tpu-vm scp --recurse "$root" "$TPU_NAME":~/tx --zone="$ZONE" \
  --project="$PROJECT" --worker=all
ssh_all "cd ~/tx && python3 -m pip install -q -e '.[tpu]'"
