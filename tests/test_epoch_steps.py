"""The steps of one epoch (fkjax.training.epoch_steps), with a counting step."""
import numpy as np
import pytest

from fkjax.training import epoch_steps


def _run(steps_per_epoch=6, skip=0, checkpoint_every=0, bad_step=None,
         steps_per_dispatch=1, scan_limit=None):
  events = []

  def step_fn(state, batches, step):
    loss = [float("nan") if s == bad_step else 1.0
            for s in range(step, step + len(batches))]
    if len(batches) == 1:
      events.append(("step", step, batches[0]))
      return state + 1, {"loss": loss[0]}
    events.append(("steps", step, tuple(batches)))
    return state + len(batches), {"loss": np.asarray(loss)}

  def on_metrics(step, metrics):
    events.append(("metrics", step))
    if metrics["loss"] != metrics["loss"]:
      raise FloatingPointError(f"loss at step {step}")
    return {"loss": f"{metrics['loss']:.3f}"}

  def save(step, state):
    events.append(("save", step, state))

  ran = epoch_steps.run_epoch_steps(
      0, iter(range(steps_per_epoch)), first_step=12, skip=skip,
      steps_per_epoch=steps_per_epoch, step_fn=step_fn,
      on_metrics=on_metrics, save=save, checkpoint_every=checkpoint_every,
      desc="epoch", progress=False, steps_per_dispatch=steps_per_dispatch,
      scan_limit=scan_limit)
  return ran, events


def test_metrics_are_read_one_step_late():
  ran, events = _run(steps_per_epoch=3)
  assert events == [("step", 12, 0), ("step", 13, 1), ("metrics", 12),
                    ("step", 14, 2), ("metrics", 13), ("metrics", 14)]
  assert (ran.state, ran.steps) == (3, 3)


def test_a_resumed_epoch_skips_the_steps_done():
  ran, events = _run(steps_per_epoch=6, skip=4)
  assert [e[1:] for e in events if e[0] == "step"] == [(16, 4), (17, 5)]
  assert ran.steps == 2


def test_a_mid_epoch_checkpoint_follows_its_loss_check():
  # global steps 12..17; every 4 steps: a save after step 15 (state 16)
  _, events = _run(steps_per_epoch=6, checkpoint_every=4)
  i = events.index(("save", 16, 4))
  assert events[i - 1] == ("metrics", 15)
  assert [e for e in events if e[0] == "save"] == [("save", 16, 4)]
  # a bad loss stops the epoch before its checkpoint is written
  with pytest.raises(FloatingPointError, match="step 15"):
    _run(steps_per_epoch=6, checkpoint_every=4, bad_step=15)


def test_throughput_leaves_out_the_first_step():
  ran, _ = _run(steps_per_epoch=3)
  assert ran.steady_seconds is not None and ran.steady_seconds >= 0
  if ran.steady_seconds:
    assert ran.images_per_second(10) == pytest.approx(
        20 / ran.steady_seconds)
  single, _ = _run(steps_per_epoch=1)
  assert single.steady_seconds is None
  assert single.images_per_second(10) is None


def test_several_steps_a_dispatch_read_one_dispatch_late():
  # 7 steps, 3 a dispatch, the last batch smaller (scan_limit 6)
  ran, events = _run(steps_per_epoch=7, steps_per_dispatch=3, scan_limit=6)
  assert events == [("steps", 12, (0, 1, 2)), ("steps", 15, (3, 4, 5)),
                    ("metrics", 12), ("metrics", 13), ("metrics", 14),
                    ("step", 18, 6), ("metrics", 15), ("metrics", 16),
                    ("metrics", 17), ("metrics", 18)]
  assert (ran.state, ran.steps, ran.steady_steps) == (7, 7, 4)


def test_dispatches_stop_at_every_checkpoint():
  # global steps 12..17, saves after steps 13 and 15 (every 2): 2 steps a
  # dispatch end at each save
  _, events = _run(steps_per_epoch=6, checkpoint_every=2,
                   steps_per_dispatch=2)
  assert [e[:2] for e in events if e[0] in ("steps", "step", "save")] == [
      ("steps", 12), ("save", 14), ("steps", 14), ("save", 16),
      ("steps", 16)]
  _, events = _run(steps_per_epoch=6, checkpoint_every=4, skip=1,
                   steps_per_dispatch=2)
  # a resumed epoch from step 13, a save after step 15: the dispatch of
  # steps 15 and 16 would span it, so step 15 runs alone
  assert [e[:2] for e in events if e[0] in ("steps", "step", "save")] == [
      ("steps", 13), ("step", 15), ("save", 16), ("steps", 16)]


def test_a_bad_loss_inside_a_dispatch_names_its_step():
  with pytest.raises(FloatingPointError, match="step 14"):
    _run(steps_per_epoch=6, steps_per_dispatch=3, bad_step=14)


@pytest.mark.parametrize("done,first,k,limit,every,size", [
    (0, 0, 1, 10, 0, 1), (0, 0, 4, 10, 0, 4), (8, 0, 4, 10, 0, 1),
    (6, 0, 4, 10, 0, 4), (0, 5, 4, 10, 8, 1), (0, 6, 4, 10, 8, 1),
    (0, 8, 4, 10, 8, 4),
    (0, 4, 4, 10, 8, 4)])
def test_dispatch_size(done, first, k, limit, every, size):
  assert epoch_steps.dispatch_size(
      done, first_step=first, steps_per_dispatch=k, scan_limit=limit,
      checkpoint_every=every) == size
