#!/usr/bin/env bash
# Start training on every worker with the same command; jax.distributed initialises itself
# on a pod slice. Needs PROJECT, ZONE, TPU_NAME, CONFIG (e.g. configs/big.py) and WORKDIR, the
# run's place every worker reads and writes: a bucket, e.g. WORKDIR=gs://my-bucket/runs/table2/big_ende
# (tx/storage.py; a shared mount also works). EXTRA_ARGS are appended (e.g. --take-over-lock).
# Running it again after a preemption resumes from the newest checkpoint in WORKDIR.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME CONFIG WORKDIR
ssh_all "cd ~/tx && nohup python3 -m tx train $(tx_args) > ~/train.log 2>&1 &"
