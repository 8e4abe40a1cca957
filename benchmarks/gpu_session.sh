#!/usr/bin/env bash
# The GPU-speed measurements (docs/performance.md), in one command with no
# arguments that fits one device call of 8 minutes:
#
#   bash benchmarks/gpu_session.sh            # on a lent GPU machine
#   SMOKE=1 bash benchmarks/gpu_session.sh    # on a CPU, to check the script
#
# Run from the repository root with JAX (CUDA), Flax, optax, orbax, chex and
# tqdm installed. ml-collections and tensorboardX, which the lent machines
# lack, are installed from ./.whl when it holds wheels: make it here with
# `bash benchmarks/gpu_wheels.sh` and name `.whl` in the device call's carry.
# Results go to $OUT (default /tmp/fkjax_gpu):
#   gpu_latest.json        the figures (benchmarks/gpu_speed.py), rewritten
#                          after every row, so a call stopped at its limit
#                          keeps what it measured
#   gpu_speed_rows.jsonl   every row's raw figures
#   log.txt                everything printed
# At home: copy gpu_latest.json and log.txt to benchmarks/results/ (the
# latter as gpu_latest.log) and commit them.
#
# The reproduction queue's data rides along: parts of CIFAR-10
# (reproduce.datapack) found in .datapack/ are staged where
# benchmarks/gpu_reproduce.sh looks for them (STAGE, /tmp/fkjax_datapack),
# so this call saves the queue one of the calls that carry the data in
# (docs/reproduction.md, "The queue").
set -u
OUT=${OUT:-/tmp/fkjax_gpu}
export OUT
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
log() { echo "=== $(date +%T) $*"; }

if ls .whl/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/fkjax_site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/fkjax_site"
fi

DATAPACK=${DATAPACK:-.datapack}
if ls "$DATAPACK"/* > /dev/null 2>&1; then
  STAGE=${STAGE:-/tmp/fkjax_datapack}
  mkdir -p "$STAGE" && cp "$DATAPACK"/* "$STAGE"/ \
    && log "staged $(ls "$DATAPACK" | tr '\n' ' ')in $STAGE"
fi

log machine
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version \
  --format=csv 2>/dev/null || echo "no nvidia-smi"
$PY -m pip list 2>/dev/null | grep -iE \
  "^(jax|jaxlib|jax-cuda.*|flax|optax|orbax-checkpoint|chex|ml.collections|tensorboardx|numpy|tqdm) "
if ! timeout 120 $PY -c "import fkjax, jax; print(jax.devices())"; then
  export FKJAX_NO_XLA_FLAGS=1
  log "importing fkjax failed with its XLA flags; FKJAX_NO_XLA_FLAGS=1 from here"
fi

log "gpu_speed (budget ${BUDGET:-420} s)"
timeout $(( ${BUDGET:-420} + 60 )) $PY -m benchmarks.gpu_speed
rc=$?
log "done (rc=$rc)"
exit $rc
