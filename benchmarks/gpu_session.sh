#!/usr/bin/env bash
# The GPU measurements of docs/performance.md, in one command.
#
# Run from the repository root on a machine with a CUDA GPU, JAX (CUDA),
# Flax, optax, orbax, chex, torch (CUDA) and tqdm installed; ml-collections
# and tensorboardX are installed from ./.whl if that folder holds wheels
# (machines without internet). Results go to $OUT (default /tmp/fkjax_gpu):
#   log.txt                  everything printed
#   epochs_<model>.jsonl     train.py metrics: 2 PGD-10 epochs on 45,000
#                            synthetic CIFAR-shaped images (speed does not
#                            depend on pixel values; CIFAR-10 itself is too
#                            big to carry to such a machine here)
#   bench_a.json             fkjax vs PyTorch (same GPU, same run) for
#                            ResNet20 and En2ResNet20 (tables in log.txt)
#   bench_b.json             the PGD-10 step of En5ResNet20
#   bench_c.json             En2ResNet20 with its members in sequence
#   tests.txt                a GPU run of the model and attack tests
# SMOKE=1 shrinks everything to check this script on a CPU in minutes.
set -u
OUT=${OUT:-/tmp/fkjax_gpu}
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

log machine
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version \
  --format=csv 2>/dev/null || echo "no nvidia-smi"
$PY -m pip list 2>/dev/null | grep -iE \
  "^(jax|jaxlib|jax-cuda.*|flax|optax|orbax-checkpoint|chex|ml.collections|tensorboardx|torch|numpy|tqdm) "
if ! timeout 120 $PY -c "import fkjax, jax; print(jax.devices())"; then
  export FKJAX_NO_XLA_FLAGS=1
  log "importing fkjax failed with its XLA flags; FKJAX_NO_XLA_FLAGS=1 from here"
fi

if [ "${SMOKE:-0}" = 1 ]; then
  MODELS_A=resnet20; MODELS_B=en2resnet20
  EPOCH_ARGS=(--config.model.depth=8 --config.training.batch_size=32
              --config.attack.num_steps=1 --config.dataset.val_size=100
              "--config.dataset.synthetic_sizes=(420,100)"
              --config.validation.attack_steps=1)
  BENCH_ARGS=(--batch 8 --eval-batch 8 --steps 1 --eval-steps 1 --repeats 1
              --warmup 0)
  TESTS=(tests/test_models.py -k "noise_keys")
else
  MODELS_A=resnet20,en2resnet20; MODELS_B=en5resnet20
  EPOCH_ARGS=()
  BENCH_ARGS=(--batch 128 --eval-batch 500 --repeats 10 --warmup 2)
  TESTS=(tests/test_models.py tests/test_attacks.py tests/test_noise.py)
fi

# 1. Whole epochs through train.py, as users run it. Epoch 1 includes the
#    compilation; epoch 2's train_seconds is the steady epoch time.
for model in resnet20 en2resnet20; do
  log "train.py $model: 2 epochs"
  rm -rf "/tmp/fkjax_wd_$model"
  timeout 150 $PY train.py --config="configs/default.py:$model" \
    --workdir="/tmp/fkjax_wd_$model" --config.dataset.source=synthetic \
    --config.training.num_epochs=2 --config.validation.num_examples=1000 \
    --config.eval.final_attacks= --config.progress=False "${EPOCH_ARGS[@]}"
  echo "rc=$? train.py $model"
  cp "/tmp/fkjax_wd_$model/metrics.jsonl" "$OUT/epochs_$model.jsonl"
done

# 2. fkjax vs PyTorch, step by step.
log "bench A"
timeout 150 $PY -m benchmarks.bench_train --models "$MODELS_A" \
  --benches pgd,ifgsm "${BENCH_ARGS[@]}" \
  --json "$OUT/bench_a.json"
echo "rc=$? bench A"
log "bench B"
timeout 80 $PY -m benchmarks.bench_train --models "$MODELS_B" \
  --benches pgd "${BENCH_ARGS[@]}" \
  --json "$OUT/bench_b.json"
echo "rc=$? bench B"
timeout 60 $PY -m benchmarks.bench_train --models en2resnet20 \
  --benches pgd --member-execution sequential --frameworks fkjax \
  "${BENCH_ARGS[@]}" --json "$OUT/bench_c.json"
echo "rc=$? bench C"

# 3. The tests that exercise the models and attacks, on the GPU.
log tests
timeout 200 $PY -m pytest -q -p no:cacheprovider "${TESTS[@]}" \
  > "$OUT/tests.txt" 2>&1
echo "rc=$? tests"
tail -3 "$OUT/tests.txt"
log done
