#!/usr/bin/env bash
# Stream worker 0's log (only process 0 writes progress). Needs PROJECT, ZONE, TPU_NAME.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
  --worker=0 --command="tail -n 100 -f ~/train.log"
