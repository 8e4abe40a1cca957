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


# --------------------------------------------------------------------------
# The step program of a run: one compiled program, no host callback.

def _tiny_runs():
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from fkjax.training import program  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.num_devices = 1
  config.attack.num_steps = 1
  config.dataset.synthetic_sizes = (48, 16)   # train 32: 2 steps an epoch
  config.dataset.val_size = 16
  config.compilation_cache_dir = ""
  return program.Runs.build([config])


def _primitives(jaxpr):
  """Every primitive's name in ``jaxpr`` and the jaxprs inside it."""
  from jax.extend import core  # pylint: disable=import-outside-toplevel
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for sub in core.jaxprs_in_params(eqn.params):
      names |= _primitives(sub)
  return names


def test_a_run_compiles_one_step_program_and_its_steps_call_no_host():
  import jax  # pylint: disable=import-outside-toplevel
  from fkjax.training import input_pipeline  # pylint: disable=import-outside-toplevel
  runs = _tiny_runs()
  train_input = input_pipeline.TrainInput.build(
      runs.template, runs.exps[0].dataset.train)
  values = runs.placed_values()
  step_fn = runs.step_program(train_input, runs.keys("train"), values)
  state, saves = runs.initial_state(), []
  for epoch in range(2):   # 4 steps, a mid-epoch checkpoint every 3
    state = train.epoch_steps(
        state, train_input.feeds(0, epoch), first_step=2 * epoch, skip=0,
        steps_per_epoch=2, step_fn=step_fn, on_metrics=lambda s, m: {},
        save=lambda step, s: saves.append(step), checkpoint_every=3,
        desc="", progress=False).state
    state, _ = runs.end_of_epoch(state, values)
  assert runs.step_of(state) == 4 and saves == [3]
  assert len(step_fn.compiled) == 1
  assert runs.end_of_epoch._cache_size() == 1   # pylint: disable=protected-access
  feed, keys = next(iter(train_input.feeds(0, 0))), runs.keys("train")
  jaxpr = jax.make_jaxpr(lambda s, b: runs.step(s, b, 0, keys, values))(
      state, feed).jaxpr
  names = _primitives(jaxpr)
  assert "conv_general_dilated" in names or any("custom" in n for n in names)
  assert not {n for n in names if "callback" in n}, names


def test_a_training_batch_too_large_for_memory_is_refused_before_it_runs(
    monkeypatch):
  from fkjax import cli  # pylint: disable=import-outside-toplevel
  from fkjax.evaluation import memory  # pylint: disable=import-outside-toplevel
  from fkjax.training import input_pipeline  # pylint: disable=import-outside-toplevel
  runs = _tiny_runs()
  train_input = input_pipeline.TrainInput.build(
      runs.template, runs.exps[0].dataset.train)
  step_fn = runs.step_program(train_input, runs.keys("train"),
                              runs.placed_values())
  monkeypatch.setattr(memory, "free_bytes",
                      lambda device=None: (1024, "RAM available"))
  state = runs.initial_state()
  with pytest.raises(memory.BatchTooLarge,
                     match=r"^config.training.batch_size=16: the training "
                     r"step needs about .* but 0.0 GiB is free") as info:
    step_fn(state, next(iter(train_input.feeds(0, 0))), 0)
  assert cli.is_user_error(info.value)
  assert runs.step_of(state) == 0   # the state was not donated to a run


@pytest.mark.slow
def test_a_suggested_training_batch_passes_the_same_check(monkeypatch):
  # The step compiled at the batch suggested needs what the check allows:
  # the suggestion is measured, not extrapolated from batch 16.
  from fkjax.evaluation import memory  # pylint: disable=import-outside-toplevel
  from fkjax.training import input_pipeline  # pylint: disable=import-outside-toplevel
  runs = _tiny_runs()
  train_input = input_pipeline.TrainInput.build(
      runs.template, runs.exps[0].dataset.train)
  feed = next(iter(train_input.feeds(0, 0)))
  seen = []   # (batch, compiled) of every program the check read
  real_check = memory.check

  def check(compiled, batch, what, **kwargs):
    seen.append((batch, compiled))
    at_batch = kwargs.pop("at_batch")

    def recorded(b):
      seen.append((b, at_batch(b)))
      return seen[-1][1]
    if len(seen) == 1 and free_of[0] is None:
      return None   # the first pass: only measures batch 16
    return real_check(compiled, batch, what, at_batch=recorded, **kwargs)
  free_of = [None]
  monkeypatch.setattr(memory, "check", check)
  runs.step_program(train_input, runs.keys("train"), runs.placed_values())(
      runs.initial_state(), feed, 0)
  # Free: what batch 16 needs, less a third.
  free = int(memory.needed_bytes(seen[0][1]) * 2 / 3 / memory.USABLE)
  free_of[0] = free
  seen.clear()
  monkeypatch.setattr(memory, "free_bytes",
                      lambda device=None: (free, "RAM available"))
  step_fn = runs.step_program(train_input, runs.keys("train"),
                              runs.placed_values())
  with pytest.raises(memory.BatchTooLarge) as info:
    step_fn(runs.initial_state(), feed, 0)
  suggested = int(str(info.value).rsplit("=", 1)[1])
  assert 0 < suggested < 16
  # Its own program passes the same check.
  compiled = dict(seen)[suggested]
  real_check(compiled, suggested, "the training step",
             batch_key="config.training.batch_size",
             free=(free, "RAM available"))


def test_a_ctrl_c_that_a_step_swallowed_stops_before_the_next_step(
    monkeypatch):
  from fkjax import interrupt
  ran = []

  def step_fn(state, feed, step):
    ran.append(step)
    if step == 13:
      # A Ctrl-C arrives (fkjax.interrupt's handler marks it and raises
      # KeyboardInterrupt) in library code that catches and drops it.
      monkeypatch.setattr(interrupt._State, "requested", True)
      try:
        raise KeyboardInterrupt
      except KeyboardInterrupt:
        pass
    return state + 1, {"loss": 1.0}

  with interrupt.raising(), pytest.raises(KeyboardInterrupt):
    train.epoch_steps(
        0, iter(range(6)), first_step=12, skip=0, steps_per_epoch=6,
        step_fn=step_fn, on_metrics=lambda step, m: {}, save=None,
        checkpoint_every=0, desc="epoch", progress=False)
  assert ran == [12, 13]
