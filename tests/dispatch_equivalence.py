"""Two epochs of the tiny config (ResNet8, PGD-1, batch 16, 4 steps an
epoch) through a plain loop (a jitted step per batch, NumPy batches) and
through the training loop's step program (fkjax.training.program, both data
pipelines of fkjax.training.input_pipeline), for a single run and a 2-run
sweep; prints one JSON line: every variant's largest difference from the
plain loop's state and whether its per-step losses are the plain loop's.

Run as a subprocess under train.py's XLA flags (plus, in the quick test,
LLVM's optimisation off): the tests' fast-compile flags together
(tests/subprocess_env.py) compile programs that round differently.
"""
import json

import jax
import numpy as np

from configs import tiny
from fkjax import data
from fkjax import kernels
from fkjax.training import build
from fkjax.training import input_pipeline
from fkjax.training import parallel
from fkjax.training import program
from fkjax.training import step as step_lib
from fkjax.training import train

EPOCHS = 2


def config_for(**training):
  config = tiny.get_config()
  config.num_devices = 1
  config.attack.num_steps = 1
  for key, value in training.items():
    config.training[key] = value
  return config


def reference(exp):
  """A plain loop: the jitted step per batch, its key folded in outside,
  and the run's end of an epoch (its one jitted program, the loop's)."""
  config = exp.config
  step_fn = jax.jit(step_lib.make_train_step(exp.model, exp.optimizer, config),
                    donate_argnums=(0,))
  runs = program.Runs.build([config])

  def end_of_epoch(state):
    return runs.end_of_epoch(state, runs.placed_values())[0]
  base_key = build.prng_key(config.seed, "train")
  state, step, losses = exp.initial_state(), 0, []
  for epoch in range(EPOCHS):
    for batch in data.train_batches(
        exp.dataset.train, config.training.batch_size, seed=config.seed,
        epoch=epoch, augment=True, drop_last=config.training.drop_last):
      state, metrics = step_fn(state, parallel.shard_batch(batch, exp.mesh),
                               jax.random.fold_in(base_key, step))
      losses.append(float(metrics["loss"]))
      step += 1
    state = end_of_epoch(state)
  return jax.device_get(state), losses


def programs(exp):
  """A single run's step program on each pipeline, its state run-axis
  first (:class:`fkjax.training.program.Runs` of one run)."""
  out = {}
  for pipeline in ("host", "device"):
    config = config_for(data_pipeline=pipeline)
    runs = program.Runs.build([config])
    train_input = input_pipeline.TrainInput.build(config, exp.dataset.train)
    out[pipeline] = (runs, train_input, runs.step_program(
        train_input, runs.keys("train"), runs.placed_values()))
  return out


def run(exp, variant, state=None, first_epoch=0, skip=0,
        checkpoint_every=0, saved=None):
  runs, train_input, step_fn = variant
  spe = exp.steps_per_epoch
  state = runs.initial_state() if state is None else state
  values = runs.placed_values()
  losses = []
  for epoch in range(first_epoch, EPOCHS):
    ran = train.epoch_steps(
        state, train_input.feeds(exp.config.seed, epoch),
        first_step=epoch * spe, skip=skip if epoch == first_epoch else 0,
        steps_per_epoch=spe, step_fn=step_fn,
        on_metrics=lambda step, m: losses.append(
            float(np.ravel(m["loss"])[0])) or {},
        checkpoint_every=checkpoint_every,
        save=lambda step, s: saved.setdefault(step, jax.device_get(s)),
        desc="", progress=False)
    state, _ = runs.end_of_epoch(ran.state, values)
  return runs.unstack(state)[0], losses


def sweep_runs(pipeline):
  """A 2-run sweep (seeds 0 and 1, a batch stream each) for two epochs on
  ``pipeline``."""
  configs = [config_for(data_pipeline=pipeline) for _ in range(2)]
  configs[1].seed = 1
  runs = program.Runs.build(configs)
  exp = runs.exps[0]
  values = runs.placed_values()
  train_input = input_pipeline.TrainInput.build(configs[0],
                                                exp.dataset.train)
  step_fn = runs.step_program(train_input, runs.keys("train"), values)
  spe = runs.steps_per_epoch
  state = runs.initial_state()
  for epoch in range(EPOCHS):
    feeds = [train_input.feeds(c.seed, epoch) for c in configs]
    state = train.epoch_steps(
        state, map(input_pipeline.stack, zip(*feeds)),
        first_step=epoch * spe, skip=0, steps_per_epoch=spe,
        step_fn=step_fn, on_metrics=lambda step, m: {}, checkpoint_every=0,
        save=None, desc="", progress=False).state
    state, _ = runs.end_of_epoch(state, values)
  return jax.device_get(state)


def max_difference(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main():
  kernels.apply_xla_flags()  # as train.py does, before JAX starts
  exp = build.Experiment.build(config_for())
  ref_state, ref_losses = reference(exp)
  progs = programs(exp)
  out = {"steps_per_epoch": exp.steps_per_epoch}
  for pipeline in ("host", "device"):
    state, losses = run(exp, progs[pipeline])
    out[f"{pipeline}_1"] = [max_difference(state, ref_state),
                            losses == ref_losses]
  # resumed in epoch 2 from the state after its second step
  saved = {}
  run(exp, progs["device"], checkpoint_every=6, saved=saved)
  runs = progs["device"][0]
  state, _ = run(exp, progs["device"], state=runs.stack([saved[6]]),
                 first_epoch=1, skip=2)
  out["resumed"] = [max_difference(state, ref_state), sorted(saved)]
  out["sweep_device_2"] = max_difference(sweep_runs("device"),
                                         sweep_runs("host"))
  print(json.dumps(out))


if __name__ == "__main__":
  main()
