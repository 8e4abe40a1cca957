"""The steps of one epoch (fkjax.training.train.epoch_steps), with a counting
step."""
import pytest

from fkjax.training import train


def _run(steps_per_epoch=6, skip=0, checkpoint_every=0, bad_step=None):
  events = []

  def step_fn(state, feed, step):
    events.append(("step", step, feed))
    return state + 1, {"loss": float("nan") if step == bad_step else 1.0}

  def on_metrics(step, metrics):
    events.append(("metrics", step))
    if metrics["loss"] != metrics["loss"]:
      raise FloatingPointError(f"loss at step {step}")
    return {"loss": f"{metrics['loss']:.3f}"}

  def save(step, state):
    events.append(("save", step, state))

  ran = train.epoch_steps(
      0, iter(range(steps_per_epoch)), first_step=12, skip=skip,
      steps_per_epoch=steps_per_epoch, step_fn=step_fn,
      on_metrics=on_metrics, save=save, checkpoint_every=checkpoint_every,
      desc="epoch", progress=False)
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
