"""A batch that does not fit in memory is refused before it runs, in one
line naming the estimate and the largest batch that fits."""
import types

import jax
import pytest

from fkjax import attacks
from fkjax import cli
from fkjax import evaluation
from fkjax.evaluation import memory
from tests import tiny_models

_MIB = 2 ** 20


def _compiled(temp_mib, out_mib=0.0):
  analysis = types.SimpleNamespace(temp_size_in_bytes=int(temp_mib * _MIB),
                                   output_size_in_bytes=int(out_mib * _MIB),
                                   alias_size_in_bytes=0)
  return types.SimpleNamespace(memory_analysis=lambda: analysis)


def test_a_batch_within_the_free_memory_passes():
  memory.check(_compiled(80), 100, "attack x", batch_key="k",
               free=(100 * _MIB, "RAM available"))
  # Nothing known: nothing refused.
  memory.check(_compiled(10 ** 6), 100, "attack x", batch_key="k",
               free=(None, ""))


def test_a_batch_too_large_says_the_estimate_and_what_fits():
  # 10 MiB fixed + 1 MiB an image; 1,000 MiB free, 900 usable.
  with pytest.raises(memory.BatchTooLarge) as info:
    memory.check(_compiled(10 + 10_000), 10_000, "attack ifgsm20",
                 batch_key="config.eval.batch_size",
                 at_half=lambda: _compiled(10 + 5_000), multiple=4,
                 free=(1000 * _MIB, "RAM available"))
  assert str(info.value) == (
      "config.eval.batch_size=10000: attack ifgsm20 needs about 9.8 GiB for "
      "a batch of 10000 images (XLA's estimate) but 1.0 GiB is free (RAM "
      "available); the largest batch that fits is about 888: rerun with "
      "--config.eval.batch_size=888")
  assert cli.is_user_error(info.value)
  with pytest.raises(memory.BatchTooLarge, match="no batch fits"):
    memory.check(_compiled(2000), 10, "attack x", batch_key="k",
                 at_half=lambda: _compiled(1999),
                 free=(1000 * _MIB, "RAM available"))


def test_free_memory_is_the_least_of_ram_and_the_cgroup(tmp_path):
  assert memory._meminfo_available(  # pylint: disable=protected-access
      "MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2 * _MIB
  (tmp_path / "memory.max").write_text("6442450944\n")
  (tmp_path / "memory.current").write_text("1073741824\n")
  assert memory._cgroup_free(str(tmp_path)) == 5 * 2 ** 30  # pylint: disable=protected-access
  (tmp_path / "memory.max").write_text("max\n")
  assert memory._cgroup_free(str(tmp_path)) is None  # pylint: disable=protected-access
  free, where = memory.free_bytes()
  assert free is None or free > 0 and where


def test_the_evaluator_refuses_before_running(monkeypatch):
  params, images, labels = tiny_models.trained_mlp()
  ran = []

  def attack(apply_fn, variables, x, y, key):
    jax.debug.callback(lambda: ran.append(1))
    return attacks.fgsm(apply_fn, variables, x, y, key, epsilon=0.1)
  need = memory.needed_bytes(jax.jit(lambda v, x, y, k: attack(
      tiny_models.noisy_relu_mlp, v, x, y, k)).lower(
          params, images[:8], labels[:8], jax.random.key(0)).compile())
  # Free: a quarter of what a batch of 8 needs, so 4 do not fit either.
  monkeypatch.setattr(memory, "free_bytes",
                      lambda device=None: (need // 4, "RAM available"))
  evaluator = evaluation.Evaluator(tiny_models.noisy_relu_mlp,
                                   {"fgsm": attack},
                                   batch_key="config.eval.batch_size")
  batches = [{"image": images[:8], "label": labels[:8]}]
  with pytest.raises(memory.BatchTooLarge,
                     match=r"^config.eval.batch_size=8: attack fgsm needs "):
    evaluator(params, batches, jax.random.key(0), progress=False)
  assert not ran


class _Gpu:
  """What free_bytes reads of a GPU: its allocator's limit and use."""
  platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

  def memory_stats(self):
    return {"bytes_limit": 60 * 2 ** 30, "bytes_in_use": 10 * 2 ** 30}


def test_a_gpus_free_memory_says_it_is_this_process_share():
  # JAX's allocator reserves 75% of the card per process: a second process
  # (eval.py beside train.py) sees its own limit, not the card's state.
  free, where = memory.free_bytes(_Gpu())
  assert free == 50 * 2 ** 30
  assert where.startswith("NVIDIA H100 80GB HBM3 memory free to this process")
  for setting in ("XLA_PYTHON_CLIENT_MEM_FRACTION",
                  "XLA_PYTHON_CLIENT_PREALLOCATE=false"):
    assert setting in where
