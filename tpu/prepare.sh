#!/usr/bin/env bash
# Prepare the run's data once, before tpu/run.sh: the vocabulary and the token caches of
# train/dev/test, written into WORKDIR (python -m tx prepare), on worker 0 only and on its CPU
# (the TPU stays free; no jax.distributed: the other workers take no part). Waits until done;
# the output is also in worker 0's ~/prepare.log. Any other machine can do the same:
#   python -m tx prepare --config CONFIG --workdir WORKDIR
# Needs PROJECT, ZONE, TPU_NAME, CONFIG, WORKDIR (as for tpu/run.sh); EXTRA_ARGS are appended.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME CONFIG WORKDIR
ssh_worker 0 "cd ~/tx && set -o pipefail && env -u TPU_WORKER_HOSTNAMES JAX_PLATFORMS=cpu python3 -m tx prepare $(tx_args) 2>&1 | tee ~/prepare.log"
