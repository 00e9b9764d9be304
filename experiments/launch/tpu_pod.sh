#!/bin/bash
# PIPO on a Cloud TPU pod slice (e.g. v5p-32 = 4 hosts x 4 chips): the same command on every host.
#
#   experiments/launch/tpu_pod.sh my-tpu us-east5-a configs/grpo.py:qwen3_8b gs://bucket/Qwen3-8B-local-copy runs/grpo8b
#
# The repository and the model directory must exist at the same path on every host
# (copy them first, e.g. with `gcloud compute tpus tpu-vm scp --worker=all`). JAX's TPU
# cluster detection supplies coordinator / process count / id (TPU_WORKER_HOSTNAMES);
# fsdp spans the slice's ICI, so no dcn_* keys are needed within one slice.
set -euo pipefail

TPU=${1:?TPU name}
ZONE=${2:?zone}
CONFIG=${3:?config, e.g. configs/grpo.py:qwen3_8b}
MODEL=${4:?model directory present on every host}
WORKDIR=${5:?output directory (a gs:// path or a shared disk)}
shift 5
REPO=${REPO:-~/pipo_jax}

gcloud compute tpus tpu-vm ssh "$TPU" --zone="$ZONE" --worker=all --command="
  cd $REPO && . .venv/bin/activate && python -m experiments.train \
    --config=$CONFIG --config.model.path=$MODEL \
    --config.mesh.data=1 --config.mesh.fsdp=-1 --config.mesh.tensor=1 \
    --workdir=$WORKDIR $*"
