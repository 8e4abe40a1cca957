"""Checkpointer: retention of latest/best, verification, I/O errors, layouts."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import checkpoint as ckpt_lib
from fkjax.checkpoint import quiet

REPO = Path(__file__).resolve().parents[1]


def _state(step, size=64):
  """A small training-state-like tree whose values depend on ``step``."""
  key = jax.random.key(step)
  return {"step": jnp.asarray(step, jnp.int32),
          "params": {"w": jax.random.normal(key, (size,)),
                     "b": jnp.full((3,), float(step))},
          "opt_state": {"momentum": jnp.arange(size, dtype=jnp.float32)
                        * step}}


def _steps_on_disk(workdir):
  root = Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())


def _assert_state_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a),
               jax.device_get(b))


def test_one_manager_keeps_latest_two_and_the_best(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(2, _state(2))                        # mid-epoch: no metric
  assert ck.best_step() is None                # it is no "best" candidate
  ck.save(4, _state(4), val_accuracy=0.5)      # epoch 1
  ck.save(6, _state(6))
  ck.save(8, _state(8), val_accuracy=0.3)      # epoch 2, worse
  assert (ck.latest_step(), ck.best_step()) == (8, 4)
  assert _steps_on_disk(tmp_path) == [4, 6, 8]
  # Mid-epoch saves roll the latest two along without displacing the best.
  ck.save(10, _state(10))
  ck.save(11, _state(11))
  assert _steps_on_disk(tmp_path) == [4, 10, 11]
  assert ck.best_step() == 4
  ck.save(12, _state(12), val_accuracy=0.7)    # epoch 3, the new best
  assert _steps_on_disk(tmp_path) == [11, 12]
  assert (ck.latest_step(), ck.best_step()) == (12, 12)
  ck.close()

  reopened = ckpt_lib.Checkpointer(str(tmp_path), must_exist=True)
  assert (reopened.latest_step(), reopened.best_step()) == (12, 12)
  step, state = reopened.restore(_state(0), "latest")
  assert step == 12
  _assert_state_equal(state, _state(12))
  reopened.close()


def test_a_save_without_a_metric_logs_no_warning(tmp_path):
  # Mid-epoch saves carry no metric on purpose; orbax warns on each.
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  with _absl_records() as logged:
    ck.save(2, _state(2))
  assert not [r for r in logged if r.levelno >= logging.WARNING], logged
  assert ck.all_steps() == [2]


def test_best_restores_the_best_epoch(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(4, _state(4), val_accuracy=0.9)
  ck.save(8, _state(8), val_accuracy=0.1)
  ck.save(9, _state(9))
  step, state = ck.restore(_state(0), "best")
  assert step == 4
  _assert_state_equal(state, _state(4))
  with pytest.raises(ckpt_lib.CheckpointError, match="no best checkpoint"):
    ckpt_lib.Checkpointer(str(tmp_path / "fresh")).restore(_state(0), "best")
  ck.close()


def test_read_only_checkpointer_refuses_to_save(tmp_path):
  with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoints"):
    ckpt_lib.Checkpointer(str(tmp_path / "nowhere"), must_exist=True)
  assert not (tmp_path / "nowhere").exists()
  ckpt_lib.Checkpointer(str(tmp_path)).save(1, _state(1))
  reader = ckpt_lib.Checkpointer(str(tmp_path), must_exist=True)
  with pytest.raises(ckpt_lib.CheckpointError, match="for reading"):
    reader.save(2, _state(2))


def test_partial_save_is_removed_by_the_next_writer_only(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(4, _state(4), val_accuracy=0.5)
  ck.close()
  partial = tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp"
  partial.mkdir()
  (partial / "garbage").write_bytes(b"\0" * 10)
  reader = ckpt_lib.Checkpointer(str(tmp_path), must_exist=True)
  assert partial.exists()  # a training process may be writing it
  assert reader.latest_step() == 4
  writer = ckpt_lib.Checkpointer(str(tmp_path))
  writer.save(6, _state(6))
  assert not partial.exists()
  assert _steps_on_disk(tmp_path) == [4, 6]


def _data_files(step_dir):
  """The array chunk files of an ocdbt checkpoint, largest first."""
  files = [p for p in Path(step_dir).rglob("*")
           if p.is_file() and p.parent.name == "d"]
  assert files, f"no ocdbt data files under {step_dir}"
  return sorted(files, key=lambda p: p.stat().st_size, reverse=True)


def test_flipped_bytes_in_a_chunk_are_detected(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(4, _state(4, size=4096), val_accuracy=0.5)
  ck.save(8, _state(8, size=4096))
  chunk = _data_files(tmp_path / "checkpoints" / "8")[0]
  data = bytearray(chunk.read_bytes())
  middle = len(data) // 2
  data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
  chunk.write_bytes(bytes(data))
  with pytest.raises(ckpt_lib.CheckpointError) as info:
    ck.restore(_state(0, size=4096), "latest")
  message = str(info.value)
  assert "step 8 is corrupt" in message
  assert f"delete {tmp_path / 'checkpoints' / '8'}" in message
  assert "steps 4" in message
  # The advice works: without step 8 the previous checkpoint restores.
  ck.close()
  import shutil
  shutil.rmtree(tmp_path / "checkpoints" / "8")
  step, state = ckpt_lib.Checkpointer(str(tmp_path)).restore(
      _state(0, size=4096), "latest")
  assert step == 4
  _assert_state_equal(state, _state(4, size=4096))


def _tamper_metadata(step_dir, how):
  metadata = Path(step_dir) / "_CHECKPOINT_METADATA"
  if how == "deleted":
    metadata.unlink()
  elif how == "not JSON":
    metadata.write_text("{not json")
  else:  # the digests alone removed, the rest of orbax's metadata kept
    text = metadata.read_text()
    import json
    content = json.loads(text)
    del content["custom_metadata"]["fkjax"]
    metadata.write_text(json.dumps(content))


@pytest.mark.parametrize("how, says", [
    ("deleted", "_CHECKPOINT_METADATA, which holds the digests of its "
                "arrays, is missing"),
    ("not JSON", "_CHECKPOINT_METADATA, which holds the digests of its "
                 "arrays, is not valid JSON"),
    ("digests removed", "_CHECKPOINT_METADATA holds no digests"),
])
def test_rewritten_arrays_without_their_digests_are_refused(tmp_path, how,
                                                            says):
  # Arrays rewritten (here: another state's), then the digests that would
  # expose them removed: the checkpoint was restored with exit 0 after a
  # log warning.
  run, other = tmp_path / "run", tmp_path / "other"
  ckpt_lib.Checkpointer(str(run)).save(8, _state(8))
  ckpt_lib.Checkpointer(str(other)).save(8, _state(9))
  step_dir = run / "checkpoints" / "8"
  shutil.rmtree(step_dir / "default")
  shutil.copytree(other / "checkpoints" / "8" / "default", step_dir / "default")
  _tamper_metadata(step_dir, how)
  with _absl_records() as logged:
    with pytest.raises(ckpt_lib.CheckpointError) as info:
      ckpt_lib.Checkpointer(str(run), must_exist=True).restore(_state(0),
                                                               "latest")
  # The error says it once; orbax's log lines of the same are dropped.
  assert not [r for r in logged if "Metadata file" in str(r.msg)], logged
  message = str(info.value)
  assert message.startswith(
      "the latest checkpoint step 8 cannot be verified: its metadata file "
      f"{step_dir}")
  assert says in message
  assert "--allow_unverified_checkpoint" in message
  assert "FKJAX_ALLOW_UNVERIFIED_CHECKPOINT=1" in message
  # Allowed explicitly (or by the environment), it restores the rewritten
  # arrays, with a warning.
  for reader in (ckpt_lib.Checkpointer(str(run), allow_unverified=True),
                 _with_env(ckpt_lib.ALLOW_UNVERIFIED_ENV, "1", lambda:
                           ckpt_lib.Checkpointer(str(run)))):
    with _absl_records() as logged:
      step, state = reader.restore(_state(0), "latest")
    assert step == 8
    _assert_state_equal(state, _state(9))
    # fkjax's own warning says it; orbax's complaints are dropped here too.
    assert not [r for r in logged if "Metadata file" in str(r.msg)], logged


@contextlib.contextmanager
def _absl_records():
  """The records absl's logger handles within the block."""
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logging.getLogger("absl").addHandler(handler)
  try:
    yield records
  finally:
    logging.getLogger("absl").removeHandler(handler)


def _with_env(name, value, make):
  before = os.environ.get(name)
  os.environ[name] = value
  try:
    return make()
  finally:
    if before is None:
      del os.environ[name]
    else:
      os.environ[name] = before


def test_the_cli_flag_allows_unverified_checkpoints(tmp_path):
  # The flag sets the variable (in a process of its own: absl's flags are
  # global; without JAX, which the flag's path never needs)...
  script = textwrap.dedent("""
      import os, sys
      from fkjax import cli
      def main(argv):
        print(os.environ.get(cli.ALLOW_UNVERIFIED_ENV), "jax" in sys.modules)
      cli.run(main)
  """)
  env = {k: v for k, v in os.environ.items()
         if k != ckpt_lib.ALLOW_UNVERIFIED_ENV}
  outputs = [subprocess.run([sys.executable, "-c", script, *flag], cwd=REPO,
                            env=env, capture_output=True, text=True,
                            timeout=120).stdout.strip()
             for flag in ([], ["--allow_unverified_checkpoint"])]
  assert outputs == ["None False", "1 False"]
  # ... which every Checkpointer reads, however deep it is built.
  from fkjax import cli  # pylint: disable=import-outside-toplevel
  assert cli.ALLOW_UNVERIFIED_ENV == ckpt_lib.ALLOW_UNVERIFIED_ENV
  readers = [_with_env(ckpt_lib.ALLOW_UNVERIFIED_ENV, value, lambda:
                       ckpt_lib.Checkpointer(str(tmp_path)))
             for value in ("", "1")]
  assert [r.allow_unverified for r in readers] == [False, True]


def test_truncated_chunk_is_an_error(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(3, _state(3, size=4096))
  chunk = _data_files(tmp_path / "checkpoints" / "3")[0]
  chunk.write_bytes(chunk.read_bytes()[:100])
  with pytest.raises(ckpt_lib.CheckpointError,
                     match="could not restore|corrupt"):
    ck.restore(_state(0, size=4096), "latest")


def test_nonfinite_values_are_refused(tmp_path):
  state = _state(5)
  state["opt_state"]["momentum"] = state["opt_state"]["momentum"].at[3].set(
      jnp.inf)
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(5, state)
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"non-finite values \(\['opt_state'\]\['momentum'\]"
                     ) as info:
    ck.restore(_state(0), "latest")
  assert "only checkpoint" in str(info.value)


def test_wrong_structure_is_an_error(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(1, _state(1, size=8))
  with pytest.raises(ckpt_lib.CheckpointError, match="config"):
    ck.restore(_state(0, size=16), "latest")
  # Arrays one side lacks: named, in one line.
  other = _state(0, size=8)
  other["params"]["extra"] = jnp.zeros((2,))
  del other["opt_state"]
  with pytest.raises(ckpt_lib.CheckpointError) as info:
    ck.restore(other, "latest")
  assert str(info.value) == (
      f"checkpoint {tmp_path / 'checkpoints' / '1'} does not match the "
      "config's model/optimizer: the config has params/extra that the "
      "checkpoint lacks; the checkpoint has opt_state/momentum that the "
      "config lacks; was it written with another config?")


def test_a_checkpoint_of_other_dtypes_is_one_line(tmp_path):
  # Orbax casts what it reads to the template's dtype, and the digests then
  # called the checkpoint corrupt: a bf16 template on a float32 checkpoint.
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(1, _state(1, size=8))
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16)
                      if x.dtype == jnp.float32 else x, _state(0, size=8))
  with pytest.raises(ckpt_lib.CheckpointError) as info:
    ck.restore(bf16, "latest")
  assert str(info.value) == (
      f"checkpoint {tmp_path / 'checkpoints' / '1'} does not match the "
      "config's model/optimizer: opt_state/momentum has dtype float32 there "
      "and bfloat16 in the config (2 more arrays differ); was it written "
      "with another config?")
  # The same dtypes restore as before.
  step, state = ck.restore(_state(0, size=8), "latest")
  assert step == 1
  _assert_state_equal(state, _state(1, size=8))


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
    # how tensorstore reports it, wrapped by orbax
    RuntimeError("save failed"),
])
def test_full_disk_is_one_clear_error(tmp_path, monkeypatch, error):
  if isinstance(error, RuntimeError):
    error.__cause__ = ValueError(
        'OUT_OF_RANGE: Error writing "w/0" in OCDBT database: Failed to '
        "write 1009211 bytes to file 7: No space left on device "
        "[os_error_code='28']")
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(4, _state(4), val_accuracy=0.5)

  def fail(*args, **kwargs):
    raise error
  monkeypatch.setattr(ck._manager, "save", fail)
  with pytest.raises(ckpt_lib.CheckpointError) as info:
    ck.save(8, _state(8), val_accuracy=0.9)
  target = tmp_path / "checkpoints" / "8"
  assert str(info.value).startswith(
      f"no space left on device while saving checkpoint step 8 to {target}; "
      "free space and rerun the same command to resume")
  monkeypatch.undo()
  assert (ck.latest_step(), ck.best_step()) == (4, 4)


def test_other_errors_pass_through(tmp_path, monkeypatch):
  ck = ckpt_lib.Checkpointer(str(tmp_path))

  def fail(*args, **kwargs):
    raise TypeError("not an I/O problem")
  monkeypatch.setattr(ck._manager, "save", fail)
  with pytest.raises(TypeError, match="not an I/O problem"):
    ck.save(1, _state(1))


def test_an_asynchronous_save_holds_the_state_as_it_was(tmp_path):
  """save() returns with the files still being written; the arrays it was
  given may then be donated (deleted) and the checkpoint still holds them,
  complete after wait()."""
  ck = ckpt_lib.Checkpointer(str(tmp_path), asynchronous=True)
  state = _state(3, size=4096)
  expected = jax.device_get(state)
  ck.save(3, state, val_accuracy=0.5)
  for leaf in jax.tree.leaves(state):
    leaf.delete()   # as the next training step's donation does
  ck.wait()
  assert _steps_on_disk(tmp_path) == [3]
  ck.save(5, _state(5))   # waits for nothing: step 3 is written
  ck.close()              # waits for step 5
  reader = ckpt_lib.Checkpointer(str(tmp_path), must_exist=True)
  assert reader.all_steps() == [3, 5]
  _assert_state_equal(reader.restore(_state(0, size=4096), "best")[1],
                      expected)
  _assert_state_equal(reader.restore(_state(0), "latest")[1], _state(5))
  reader.close()


_WRITE_FAILURE = textwrap.dedent("""
    import resource, signal, sys
    import jax, jax.numpy as jnp
    from fkjax import checkpoint as ckpt_lib
    ck = ckpt_lib.Checkpointer(sys.argv[1], asynchronous=sys.argv[2] == "1")
    ck.save(1, {"w": jnp.ones((8,))}, val_accuracy=0.1)
    # Files above 64 KiB fail with EFBIG, as a full disk fails with ENOSPC.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
    try:
      ck.save(2, {"w": jax.random.normal(jax.random.key(0), (200_000,))},
              val_accuracy=0.2)
      print("saved", flush=True)
      ck.close()   # an asynchronous write's failure is raised here
    except ckpt_lib.CheckpointError as e:
      print("error:", e, file=sys.stderr)
      sys.exit(1)
""")


@pytest.mark.parametrize("asynchronous", [False, True])
def test_real_write_failure_is_one_line(tmp_path, asynchronous):
  """A write that fails inside tensorstore: one line, no orbax tracebacks;
  asynchronous, it is raised when the save is waited for."""
  proc = subprocess.run([sys.executable, "-c", _WRITE_FAILURE,
                         str(tmp_path), str(int(asynchronous))], cwd=REPO,
                        capture_output=True,
                        text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": str(REPO)})
  assert proc.returncode == 1, proc.stderr
  # the synchronous save raises in save(), the asynchronous one after it
  assert ("saved" in proc.stdout) == asynchronous
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith(
      f"error: could not write checkpoint step 2 to "
      f"{tmp_path / 'checkpoints' / '2'}: File too large;")
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  assert ck.all_steps() == [1]
  step, state = ck.restore({"w": jnp.zeros((8,))}, "best")
  assert step == 1
  np.testing.assert_array_equal(state["w"], np.ones(8))


_INTERRUPTED_SAVES = textwrap.dedent("""
    import sys
    import jax
    from fkjax import checkpoint as ckpt_lib
    from fkjax import cli
    ck = ckpt_lib.Checkpointer(sys.argv[1])
    state = {f"w{i}": jax.random.normal(jax.random.key(i), (2_000_000,))
             for i in range(8)}
    try:
      for step in range(1, 1000):
        print("saving", step, flush=True)
        ck.save(step, state, val_accuracy=0.1)
    except KeyboardInterrupt:
      print("error:", cli.INTERRUPTED, file=sys.stderr)
      sys.exit(130)
""")


@pytest.mark.parametrize("delay", [0.1, 0.2, 0.3])
def test_ctrl_c_during_a_save_is_one_line(tmp_path, delay):
  """Ctrl-C while orbax's threads write (a save of 64 MB takes longer than
  ``delay``): 45 lines of their tracebacks came after the one line, or the
  process aborted in tensorstore at exit."""
  proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_SAVES,
                           str(tmp_path)], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
  while not proc.stdout.readline().startswith("saving 3"):
    pass
  time.sleep(delay)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, err
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith(
      "error: interrupted; rerun the same command to resume"), err
  # What was saved before restores; the cut save is cleaned up.
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  step = ck.latest_step()
  assert step in (2, 3)
  ck.restore({f"w{i}": jnp.zeros((2_000_000,)) for i in range(8)}, "latest")
  assert not [p for p in (tmp_path / "checkpoints").iterdir()
              if "tmp" in p.name]


_OTHER_SHAPES = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    from fkjax import checkpoint as ckpt_lib
    ck = ckpt_lib.Checkpointer(sys.argv[1])
    ck.save(1, {"w": jnp.ones((16,)), "b": jnp.ones((16,))}, val_accuracy=0.1)
    try:
      ck.restore({"w": jnp.ones((32,)), "b": jnp.ones((32,))}, "latest")
    except ckpt_lib.CheckpointError as e:
      print("error:", e, file=sys.stderr)
      sys.exit(1)
""")


def test_a_checkpoint_of_other_shapes_is_one_line(tmp_path):
  """Refused from its metadata: orbax's concurrent reads, each failing,
  used to leave asyncio tracebacks after the error line."""
  proc = subprocess.run([sys.executable, "-c", _OTHER_SHAPES, str(tmp_path)],
                        cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": str(REPO)})
  assert proc.returncode == 1, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines == [
      f"error: checkpoint {tmp_path / 'checkpoints' / '1'} does not match "
      "the config's model/optimizer: b has shape (16,) there and (32,) in "
      "the config (1 more arrays differ); was it written with another "
      "config?"], proc.stderr


_TRUNCATED = textwrap.dedent("""
    import sys
    from pathlib import Path
    import jax.numpy as jnp
    from fkjax import checkpoint as ckpt_lib
    ck = ckpt_lib.Checkpointer(sys.argv[1])
    state = {"w": jnp.arange(4096.0), "m": jnp.zeros((4096,))}
    ck.save(3, state)
    chunks = [p for p in (Path(sys.argv[1]) / "checkpoints" / "3").rglob("*")
              if p.is_file() and p.parent.name == "d"]
    chunk = max(chunks, key=lambda p: p.stat().st_size)
    chunk.write_bytes(chunk.read_bytes()[:100])
    try:
      ck.restore(state, "latest")
    except ckpt_lib.CheckpointError as e:
      print("error:", e, file=sys.stderr)
      sys.exit(1)
""")


@pytest.mark.parametrize("attempt", range(3))
def test_a_truncated_checkpoint_says_so_without_orbax_internals(tmp_path,
                                                                 attempt):
  """orbax's concurrent reads of the damaged chunk fail one by one; the
  coroutines it leaves report their errors (pages of tensorstore specs)
  when collected, at times only after the restore has raised (hence a few
  attempts)."""
  del attempt
  proc = subprocess.run([sys.executable, "-c", _TRUNCATED, str(tmp_path)],
                        cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": str(REPO)})
  assert proc.returncode == 1, proc.stderr
  first = proc.stderr.splitlines()[0]
  assert first.startswith("error: could not restore the latest checkpoint "
                          "at step 3"), proc.stderr
  assert first.endswith("to use the previous checkpoint")
  assert "Exception ignored" not in proc.stderr
  assert "TensorStore" not in proc.stderr


def test_a_restore_that_succeeds_leaves_the_unraisable_hook_as_it_was(
    tmp_path, monkeypatch):
  """Only a failed read leaves orbax's reports behind; only then is the hook
  that drops them installed (for good: they come at any moment after)."""
  def before(unraisable):
    del unraisable
  monkeypatch.setattr(sys, "unraisablehook", before)
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(1, _state(1))
  step, state = ck.restore(_state(0))
  assert step == 1
  _assert_state_equal(state, _state(1))
  assert sys.unraisablehook is before


def test_save_leaves_logging_as_it_was(tmp_path, monkeypatch):
  absl_logger = logging.getLogger("absl")
  before = list(absl_logger.filters)
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(1, _state(1))

  def fail(*args, **kwargs):
    absl_logger.error("worker thread failed")  # orbax logs, then raises
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(ck._manager, "save", fail)
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  absl_logger.addHandler(handler)
  try:
    with pytest.raises(ckpt_lib.CheckpointError):
      ck.save(2, _state(2))
    assert records == []  # the clear error replaces orbax's logs
    monkeypatch.setattr(ck._manager, "save", lambda *a, **k: (
        absl_logger.error("unrelated"), 1 / 0))
    with pytest.raises(ZeroDivisionError):
      ck.save(3, _state(3))
    assert [r.getMessage() for r in records] == ["unrelated"]
  finally:
    absl_logger.removeHandler(handler)
  assert absl_logger.filters == before


def _unraisable(exc, obj=None):
  return types.SimpleNamespace(object=obj, exc_type=type(exc), exc_value=exc,
                               exc_traceback=exc.__traceback__, err_msg=None)


def test_a_read_completing_after_the_restore_is_dropped_and_nothing_else():
  """A read that completes after the failed restore closed orbax's event
  loop reports "Event loop is closed" (no object) at any moment around the
  one-line error; that is dropped, other unraisable exceptions are not."""
  loop = asyncio.new_event_loop()
  loop.close()
  with pytest.raises(RuntimeError) as late:
    loop.call_soon_threadsafe(print)
  assert quiet.is_orbax_leftover(_unraisable(late.value))
  # The same message raised elsewhere, another error, or one with an
  # object, are someone else's: reported as usual.
  try:
    raise RuntimeError("Event loop is closed")
  except RuntimeError as e:
    assert not quiet.is_orbax_leftover(_unraisable(e))
  try:
    raise ValueError("x")
  except ValueError as e:
    assert not quiet.is_orbax_leftover(_unraisable(e))
  assert not quiet.is_orbax_leftover(_unraisable(late.value, object()))


@pytest.mark.parametrize("read_fails", [False, True])
def test_a_leftover_reported_during_the_read_is_dropped(tmp_path, monkeypatch,
                                                        read_fails):
  """The late read's report can come before orbax's restore has raised (it
  printed above the one-line error in one CI run): the dropping starts with
  the read, and ends with it when the read succeeds."""
  loop = asyncio.new_event_loop()
  loop.close()
  with pytest.raises(RuntimeError) as late:
    loop.call_soon_threadsafe(print)
  reported = []
  before = reported.append
  monkeypatch.setattr(sys, "unraisablehook", before)
  ck = ckpt_lib.Checkpointer(str(tmp_path))
  ck.save(1, _state(1))
  read = ck._manager.restore

  def read_reporting(*args, **kwargs):
    sys.unraisablehook(_unraisable(late.value))
    if read_fails:
      raise OSError("a damaged chunk")
    return read(*args, **kwargs)
  monkeypatch.setattr(ck._manager, "restore", read_reporting)
  if read_fails:
    with pytest.raises(ckpt_lib.CheckpointError, match="a damaged chunk"):
      ck.restore(_state(0))
    assert sys.unraisablehook is not before   # for the reports to come
  else:
    assert ck.restore(_state(0))[0] == 1
    assert sys.unraisablehook is before
  assert not reported
  sys.unraisablehook(_unraisable(ValueError("someone else's")))
  assert len(reported) == 1


def test_has_checkpoints_counts_only_complete_steps(tmp_path):
  assert not ckpt_lib.has_checkpoints(str(tmp_path))
  (tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir(parents=True)
  assert not ckpt_lib.has_checkpoints(str(tmp_path))
  ckpt_lib.Checkpointer(str(tmp_path)).save(4, _state(4))
  assert ckpt_lib.has_checkpoints(str(tmp_path))
