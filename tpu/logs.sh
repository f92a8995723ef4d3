#!/usr/bin/env bash
# Follow worker 0's log (only process 0 writes progress): ~/train.log, or LOG=prepare for
# ~/prepare.log. Needs PROJECT, ZONE, TPU_NAME.
source "$(dirname "$0")/common.sh"
require PROJECT ZONE TPU_NAME
ssh_worker 0 "tail -n 100 -f ~/${LOG:-train}.log"
