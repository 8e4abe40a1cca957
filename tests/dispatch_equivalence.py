"""Two epochs of the tiny config (ResNet8, PGD-1, batch 16, 4 steps an
epoch) through today's step loop (a jitted step per batch, NumPy batches)
and through fkjax.training.dispatch's step programs, for a single run and a 2-run
sweep; prints one JSON line: every variant's largest difference from the
loop's state and whether its per-step losses are the loop's.

Run as a subprocess under train.py's XLA flags (plus, in the quick test,
LLVM's optimisation off): the tests' fast-compile flags together
(tests/subprocess_env.py) compile programs that round differently.
"""
import json

import jax
import numpy as np

from configs import tiny
from fkjax import data
from fkjax.training import dispatch
from fkjax.training import epoch_steps
from fkjax.training import experiment
from fkjax import kernels
from fkjax.training import parallel
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
  """Today's loop: the jitted step per batch, its key folded in outside."""
  config = exp.config
  step_fn = jax.jit(train.make_train_step(exp.model, exp.optimizer, config),
                    donate_argnums=(0,))
  base_key = experiment.prng_key(config.seed, "train")
  state, step, losses = exp.initial_state(), 0, []
  for epoch in range(EPOCHS):
    for batch in data.train_batches(
        exp.dataset.train, config.training.batch_size, seed=config.seed,
        epoch=epoch, augment=True, drop_last=config.training.drop_last):
      state, metrics = step_fn(state, parallel.shard_batch(batch, exp.mesh),
                               jax.random.fold_in(base_key, step))
      losses.append(float(metrics["loss"]))
      step += 1
    state = train.end_of_epoch(state, config)
  return jax.device_get(state), losses


def programs(exp):
  key = experiment.prng_key(exp.config.seed, "train")
  out = {}
  for pipeline in ("host", "device"):
    config = config_for(data_pipeline=pipeline)
    train_input = dispatch.TrainInput.build(config, exp.dataset.train)
    out[pipeline] = (train_input,
                     train.train_program(exp, config, train_input, key))
  return out


def run(exp, program, k, state=None, first_epoch=0, skip=0,
        checkpoint_every=0, saved=None):
  train_input, step_fn = program
  spe = exp.steps_per_epoch
  state = exp.initial_state() if state is None else state
  losses = []
  for epoch in range(first_epoch, EPOCHS):
    ran = epoch_steps.run_epoch_steps(
        state, train_input.feeds(exp.config.seed, epoch),
        first_step=epoch * spe, skip=skip if epoch == first_epoch else 0,
        steps_per_epoch=spe, step_fn=step_fn,
        on_metrics=lambda step, m: losses.append(float(m["loss"])) or {},
        checkpoint_every=checkpoint_every,
        save=lambda step, s: saved.setdefault(step, jax.device_get(s)),
        desc="", progress=False, steps_per_dispatch=k,
        scan_limit=train_input.scan_limit)
    state = train.end_of_epoch(ran.state, exp.config)
  return jax.device_get(state), losses


def sweep_runs(program_of, k):
  """A 2-run sweep (seeds 0 and 1, a batch stream each) for two epochs:
  ``program_of(sweep, keys, values)`` is its step program, None for the
  sweep's jitted step on host batches (the sweep loop before step
  programs)."""
  from fkjax.training import sweep as sweep_lib  # pylint: disable=import-outside-toplevel
  configs = [config_for(data_pipeline="device") for _ in range(2)]
  configs[1].seed = 1
  sw = sweep_lib.Sweep.build(configs)
  exp = sw.exps[0]
  keys, values = sw.keys("train"), sw.placed_values()
  train_input = dispatch.TrainInput.build(configs[0], exp.dataset.train)
  spe = sw.steps_per_epoch
  state = sw.initial_state()
  for epoch in range(EPOCHS):
    feeds = [train_input.feeds(c.seed, epoch) for c in configs]
    if program_of is None:
      batches = zip(*[data.train_batches(exp.dataset.train, 16, seed=c.seed,
                                         epoch=epoch, drop_last=False)
                      for c in configs])
      for i, batch in enumerate(batches):
        state, _ = sw.train_step(state, sw.place_batch(batch), keys,
                                 epoch * spe + i, values)
    else:
      state = epoch_steps.run_epoch_steps(
          state, map(dispatch.stack, zip(*feeds)), first_step=epoch * spe,
          skip=0, steps_per_epoch=spe, step_fn=program_of(sw, keys, values),
          on_metrics=lambda step, m: {}, checkpoint_every=0, save=None,
          desc="", progress=False, steps_per_dispatch=k,
          scan_limit=train_input.scan_limit).state
    state, _ = sw.epoch_end(state, values)
  return jax.device_get(state)


def max_difference(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main():
  kernels.apply_xla_flags()  # as train.py does, before JAX starts
  exp = experiment.Experiment.build(config_for())
  ref_state, ref_losses = reference(exp)
  progs = programs(exp)
  out = {"steps_per_epoch": exp.steps_per_epoch}
  for pipeline, k in (("host", 1), ("device", 1), ("device", 3)):
    state, losses = run(exp, progs[pipeline], k)
    out[f"{pipeline}_{k}"] = [max_difference(state, ref_state),
                              losses == ref_losses]
  # resumed in epoch 2 from the state after its second step
  saved = {}
  run(exp, progs["device"], 1, checkpoint_every=6, saved=saved)
  state, _ = run(exp, progs["device"], 3,
                 state=parallel.replicate(saved[6], exp.mesh),
                 first_epoch=1, skip=2)
  out["resumed"] = [max_difference(state, ref_state), sorted(saved)]
  sweep_ref = sweep_runs(None, 1)
  out["sweep_device_2"] = max_difference(sweep_runs(
      lambda sw, keys, values: sw.program(
          dispatch.TrainInput.build(sw.template, sw.exps[0].dataset.train),
          keys, values), 2), sweep_ref)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
