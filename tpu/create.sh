#!/usr/bin/env bash
# Create a TPU VM pod slice. Needs PROJECT, ZONE, TPU_NAME, ACCELERATOR_TYPE (e.g. v4-32).
# --queued asks through a queued resource (waits for capacity); --spot for spot capacity.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME ACCELERATOR_TYPE
RUNTIME_VERSION=${RUNTIME_VERSION:-tpu-ubuntu2204-base}
if [[ "$QUEUED" == 1 ]]; then
  extra=()
  [[ "$SPOT" == 1 ]] && extra+=(--spot)
  run gcloud compute tpus queued-resources create "${TPU_NAME}-qr" --project="$PROJECT" \
    --zone="$ZONE" --node-id="$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" \
    --runtime-version="$RUNTIME_VERSION" "${extra[@]}"
else
  extra=()
  [[ "$SPOT" == 1 ]] && extra+=(--spot)
  run gcloud compute tpus tpu-vm create "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" "${extra[@]}"
fi
