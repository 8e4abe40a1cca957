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


def _linear(fixed_mib, per_image_mib):
  return lambda b: _compiled(fixed_mib + per_image_mib * b)


def test_a_batch_too_large_says_the_estimate_and_what_fits():
  # 10 MiB fixed + 1 MiB an image; 1,000 MiB free, 900 usable, 97% of it
  # for a suggestion: 873, less 10 fixed, in multiples of 4.
  with pytest.raises(memory.BatchTooLarge) as info:
    memory.check(_compiled(10 + 10_000), 10_000, "attack ifgsm20",
                 batch_key="config.eval.batch_size",
                 at_batch=_linear(10, 1), multiple=4,
                 free=(1000 * _MIB, "RAM available"))
  assert str(info.value) == (
      "config.eval.batch_size=10000: attack ifgsm20 needs about 9.8 GiB for "
      "a batch of 10000 images (XLA's estimate) but 1.0 GiB is free (RAM "
      "available); the largest batch that fits is 860: rerun with "
      "--config.eval.batch_size=860")
  assert cli.is_user_error(info.value)
  with pytest.raises(memory.BatchTooLarge, match="no batch fits"):
    memory.check(_compiled(2000), 10, "attack x", batch_key="k",
                 at_batch=lambda b: _compiled(1999),
                 free=(1000 * _MIB, "RAM available"))


def _suggested(error: BaseException) -> int:
  return int(str(error).rsplit("=", 1)[1])


@pytest.mark.parametrize("need_mib", [
    # XLA pads the batch to a multiple of 128 and switches to a bigger
    # workspace past 512 images: not linear, and the line through the
    # batch and its half misjudges what fits.
    lambda b: 50 + 0.9 * -(-b // 128) * 128 + (300 if b > 512 else 0),
    lambda b: 300 + 0.7 * b,          # fixed + linear
    lambda b: 1e-4 * b * b + b,       # superlinear
], ids=["padded", "linear", "superlinear"])
def test_a_suggested_batch_passes_the_same_check(need_mib):
  free = (1000 * _MIB, "RAM available")
  program = lambda b: _compiled(need_mib(b))
  batch = 8518
  with pytest.raises(memory.BatchTooLarge) as info:
    memory.check(program(batch), batch, "attack x", batch_key="k",
                 at_batch=program, free=free, multiple=2)
  suggested = _suggested(info.value)
  assert 0 < suggested < batch and suggested % 2 == 0
  # Tried, it passes: the user reaches a batch that runs in one step.
  memory.check(program(suggested), suggested, "attack x", batch_key="k",
               at_batch=program, free=free, multiple=2)
  # And it is not far below the largest batch that does fit.
  largest = max(b for b in range(2, batch, 2)
                if need_mib(b) <= 1000 * memory.USABLE)
  assert need_mib(suggested) >= 0.8 * need_mib(largest)


def test_free_memory_reads_meminfo():
  assert memory._meminfo_available(  # pylint: disable=protected-access
      "MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2 * _MIB
  free, where = memory.free_bytes()
  assert free is None or free > 0 and where


_GIB = 2 ** 30


def _tree(root, files):
  for path, text in files.items():
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)
  return str(root / "proc"), str(root / "sys")


def _cgroup_free(proc, sys_fs):
  return memory._cgroup_free(proc, sys_fs)  # pylint: disable=protected-access


def test_the_cgroup_v1_limit_is_the_processs_own(tmp_path):
  # A job's child cgroup holds the limit; the hierarchy's root has none.
  proc, sys_fs = _tree(tmp_path, {
      "proc/self/cgroup": "12:cpu,cpuacct:/job\n"
                          "11:memory:/slurm/uid_0/job_7\n3:pids:/job\n",
      "sys/memory/memory.limit_in_bytes": "9223372036854771712\n",
      "sys/memory/memory.usage_in_bytes": "1000\n",
      "sys/memory/slurm/uid_0/job_7/memory.limit_in_bytes": f"{6 * _GIB}\n",
      "sys/memory/slurm/uid_0/job_7/memory.usage_in_bytes": f"{2 * _GIB}\n",
      "sys/memory/slurm/uid_0/job_7/memory.stat":
          f"cache 5\ntotal_inactive_file {_GIB}\n",
  })
  # 6 GiB less 2 GiB used, of which 1 GiB reclaimable page cache.
  assert _cgroup_free(proc, sys_fs) == 5 * _GIB
  # A parent's tighter limit applies to its children.
  (tmp_path / "sys/memory/slurm/memory.limit_in_bytes").write_text(
      f"{3 * _GIB}\n")
  (tmp_path / "sys/memory/slurm/memory.usage_in_bytes").write_text(
      f"{2 * _GIB}\n")
  assert _cgroup_free(proc, sys_fs) == 1 * _GIB


def test_the_mounts_are_where_mountinfo_says(tmp_path):
  # A hybrid layout (v2 at .../unified) and a container whose v1 memory
  # mount's root is its own cgroup.
  sys_fs = tmp_path / "elsewhere"
  proc, _ = _tree(tmp_path, {
      "proc/self/cgroup": "4:memory:/docker/abc/job\n0::/\n",
      "proc/self/mountinfo":
          f"35 31 0:32 /docker/abc {sys_fs}/mem rw - cgroup cgroup "
          "rw,memory\n"
          f"41 31 0:38 / {sys_fs}/unified rw - cgroup2 cgroup2 rw\n"
          "22 1 0:5 / /proc rw - proc proc rw\n",
      "elsewhere/unified/memory.max": "max\n",
      "elsewhere/unified/memory.current": "1\n",
      "elsewhere/mem/memory.limit_in_bytes": f"{8 * _GIB}\n",
      "elsewhere/mem/memory.usage_in_bytes": f"{_GIB}\n",
      "elsewhere/mem/job/memory.limit_in_bytes": f"{4 * _GIB}\n",
      "elsewhere/mem/job/memory.usage_in_bytes": f"{_GIB}\n",
  })
  assert _cgroup_free(proc, "/nonexistent") == 3 * _GIB


def test_the_cgroup_v2_limit_is_the_processs_own(tmp_path):
  proc, sys_fs = _tree(tmp_path, {
      "proc/self/cgroup": "0::/user.slice/run-1.scope\n",
      "sys/memory.max": "max\n",   # the root: none
      "sys/memory.current": "5\n",
      "sys/user.slice/memory.max": "max\n",
      "sys/user.slice/memory.current": "5\n",
      "sys/user.slice/run-1.scope/memory.max": f"{6 * _GIB}\n",
      "sys/user.slice/run-1.scope/memory.current": f"{_GIB}\n",
  })
  assert _cgroup_free(proc, sys_fs) == 5 * _GIB
  (tmp_path / "sys/user.slice/run-1.scope/memory.max").write_text("max\n")
  assert _cgroup_free(proc, sys_fs) is None
  # Inside a container (its own cgroup namespace): "/" is its root.
  proc, sys_fs = _tree(tmp_path / "c", {
      "proc/self/cgroup": "0::/\n",
      "sys/memory.max": f"{4 * _GIB}\n",
      "sys/memory.current": f"{_GIB}\n",
      "sys/memory.stat": f"anon 1\ninactive_file {_GIB // 2}\n",
  })
  assert _cgroup_free(proc, sys_fs) == 3 * _GIB + _GIB // 2


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


def test_a_host_batch_too_large_is_refused_before_it_is_gathered():
  free = (1000 * _MIB, "RAM available")
  with pytest.raises(memory.BatchTooLarge) as info:
    memory.check_host(100_000_000, 3072 * 9, "a batch of test images",
                      batch_key="config.eval.batch_size", free=free)
  assert str(info.value).startswith(
      "config.eval.batch_size=100000000: a batch of test images would "
      "take 2574.9 GiB of host memory but 1.0 GiB is free (RAM available); ")
  suggested = _suggested(info.value)
  memory.check_host(suggested, 3072 * 9, "x", batch_key="k", free=free)
  # The process's own limits are read when nothing is given.
  memory.check_host(1, 1, "x", batch_key="k")


def test_settings_that_size_host_arrays_are_checked_before_allocating(
    monkeypatch):
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(memory, "_meminfo_available", lambda: 2 * _GIB)
  monkeypatch.setattr(memory, "_cgroup_free", lambda: None)
  config = tiny.get_config()
  # 10^9 synthetic images: refused before any is made.
  config.dataset.synthetic_sizes = (10 ** 9, 16)
  config.dataset.val_size = 16
  with pytest.raises(memory.BatchTooLarge,
                     match=r"^config.dataset.synthetic_sizes=\(1000000000, "
                     r"16\): 1,000,000,016 synthetic images would take .* "
                     r"at most [0-9,]+ fit \(train pool and test"):
    build.load_dataset(config)
  config.dataset.synthetic_sizes = (64, 16)
  dataset = build.load_dataset(config)
  for key in ("eval.batch_size", "validation.batch_size"):
    section, name = key.split(".")
    big = config.copy_and_resolve_references()
    big[section][name] = 100_000_000
    with pytest.raises(memory.BatchTooLarge) as info:
      memory.check_host_batches(big, dataset)
    assert str(info.value).startswith(f"config.{key}=100000000: a batch of ")
    big[section][name] = _suggested(info.value)
    memory.check_host_batches(big, dataset)   # the suggestion passes


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
