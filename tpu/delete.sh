#!/usr/bin/env bash
# Delete the slice (and its queued resource with --queued). Needs PROJECT, ZONE, TPU_NAME.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME
if [[ "$QUEUED" == 1 ]]; then
  run gcloud compute tpus queued-resources delete "${TPU_NAME}-qr" --project="$PROJECT" \
    --zone="$ZONE" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --quiet
fi
