#!/usr/bin/env bash
# GRPO+PIPO on a Cloud TPU pod slice: the same command on every worker; JAX's TPU cluster
# detection (TPU_WORKER_HOSTNAMES) starts jax.distributed. fsdp over the whole slice.
# Usage (from a machine with gcloud): experiments/launch/tpu_pod.sh TPU_NAME ZONE /gcs-fuse/Qwen3-8B /gcs-fuse/runs/grpo8b
set -euo pipefail
tpu=${1:?TPU name}; zone=${2:?zone}; model=${3:?HF model directory on every worker}; workdir=${4:?shared workdir}
shift 4
gcloud compute tpus tpu-vm ssh "${tpu}" --zone="${zone}" --worker=all --command="
  cd ~/pipo_jax && . .venv/bin/activate &&
  python -m experiments.train --config=configs/grpo.py:qwen3_8b --config.pipo.enabled=true \
    --config.model.path=${model} --workdir=${workdir} \
    --config.mesh.fsdp=-1 --config.mesh.data=1 $*"
