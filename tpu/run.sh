#!/usr/bin/env bash
# Start training on every worker with the same command; jax.distributed initialises itself
# on a pod slice. Needs PROJECT, ZONE, TPU_NAME, CONFIG (e.g. configs/big.py), WORKDIR
# (a path every worker shares, e.g. a GCS FUSE or NFS mount). EXTRA_ARGS are appended.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME CONFIG WORKDIR
ssh_all "cd ~/tx && nohup python3 train.py --config $CONFIG --workdir $WORKDIR ${EXTRA_ARGS:-} > ~/train.log 2>&1 &"
