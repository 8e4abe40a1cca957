"""The protocol's defaults where the paper is silent (docs/protocol.md)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default, tiny
from fkjax import attacks
from fkjax import data
from fkjax.training import build
from fkjax import models
from fkjax.config import record as run_config
from fkjax.training import step as step_lib


def test_defaults_follow_the_text_then_the_authors_code():
  c = default.get_config()
  # the paper's text
  assert c.attack.epsilon == pytest.approx(8 / 255)
  assert c.attack.step_size == pytest.approx(2 / 255)
  assert (c.dataset.val_size, c.validation.split) == (5000, "val")
  # silent in the text: the authors' code
  assert c.model.normalize is False
  assert c.attack.bn_mode == "update"
  assert c.training.reset_momentum is True
  assert c.training.drop_last is False
  assert c.sparsity.admm_variant == "exact"


def test_authors_preset():
  c = default.get_config("en5resnet20,authors")
  run_config.validate(c)
  assert (c.dataset.val_size, c.validation.split, c.validation.select_by,
          c.validation.attack_steps) == (0, "test", "pgd", 10)
  assert (c.attack.epsilon, c.attack.step_size) == (0.031, 0.007)
  assert c.sparsity.admm_variant == "authors"


def test_last_partial_batch_is_kept_or_dropped():
  rng = np.random.default_rng(0)
  split = data.Split(rng.integers(0, 255, (10, 32, 32, 3), np.uint8),
                     np.arange(10, dtype=np.int32))
  kept = list(data.train_batches(split, 4, seed=0, epoch=0, augment=False,
                                 drop_last=False))
  assert [len(b["label"]) for b in kept] == [4, 4, 2]
  assert sorted(np.concatenate([b["label"] for b in kept])) == list(range(10))
  dropped = list(data.train_batches(split, 4, seed=0, epoch=0,
                                    augment=False))
  assert [len(b["label"]) for b in dropped] == [4, 4]
  # the full batches are the same either way
  for a, b in zip(kept, dropped):
    np.testing.assert_array_equal(a["image"], b["image"])
  assert data.steps_per_epoch(10, 4, drop_last=False) == 3
  odd = data.Split(split.images[:9], split.labels[:9])   # last batch: 1
  with pytest.raises(ValueError, match="does not divide over 2 processes"):
    data.train_batches(odd, 4, seed=0, epoch=0, drop_last=False,
                       process_count=2, process_index=0)


def test_momentum_reset_zeroes_the_buffers_and_keeps_the_counts():
  tx = optax.chain(optax.add_decayed_weights(1e-4),
                   optax.sgd(optax.piecewise_constant_schedule(0.1, {2: 0.1}),
                             momentum=0.9, nesterov=True))
  params = {"w": jnp.ones((3,))}
  state = tx.init(params)
  for _ in range(3):
    _, state = tx.update({"w": jnp.ones((3,))}, state, params)
  reset = step_lib.reset_momentum(state)
  traces = [n for n in jax.tree.leaves(
      reset, is_leaf=lambda n: isinstance(n, optax.TraceState))
            if isinstance(n, optax.TraceState)]
  assert traces and all(float(jnp.abs(t.trace["w"]).max()) == 0
                        for t in traces)
  counts = lambda s: [x for x in jax.tree.leaves(s) if x.dtype == jnp.int32]
  assert counts(reset) == counts(state) and counts(state)


@pytest.mark.slow
def test_attack_updating_batch_stats_matches_pgd_and_torch_semantics():
  model = models.create_model(depth=8, ensemble_size=1, noise_coef=0.0)
  # 16x16 images: the semantics do not depend on the size, compiling and
  # running do.
  x = jax.random.uniform(jax.random.key(0), (8, 16, 16, 3))
  y = jnp.arange(8) % 10
  variables = jax.jit(model.init)(jax.random.key(1), x)
  key = jax.random.key(2)
  kw = dict(epsilon=8 / 255, step_size=2 / 255)
  # Jitted: run eagerly, op by op, these calls took ~50 s on 2 cores.
  x_adv, stats = jax.jit(functools.partial(
      step_lib.pgd_updating_batch_stats, model, num_steps=3, **kw))(
          variables, x, y, key)
  _, train_apply = build.model_fns(model)
  pgd = jax.jit(functools.partial(attacks.pgd, train_apply, unroll=1, **kw),
                static_argnames="num_steps")
  np.testing.assert_allclose(x_adv, pgd(variables, x, y, key, num_steps=3),
                             atol=1e-6)
  # Running averages after 3 forward passes in train mode, one per step, at
  # the iterates the attack visited (the last one is not evaluated).
  train_forward = jax.jit(functools.partial(model.apply, train=True,
                                            mutable=["batch_stats"]))
  manual = variables["batch_stats"]
  for k in (0, 1, 2):
    xi = pgd(variables, x, y, key, num_steps=k)
    _, new = train_forward({"params": variables["params"],
                            "batch_stats": manual}, xi)
    manual = new["batch_stats"]
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-5),
               stats, manual)
  before = jax.tree.leaves(variables["batch_stats"])
  assert any(not np.allclose(a, b) for a, b in
             zip(before, jax.tree.leaves(stats)))


def test_validation_split_test_needs_no_val_split():
  config = tiny.get_config("authors")
  config.num_devices = 1
  exp = build.Experiment.build(config)
  assert len(exp.dataset.val.labels) == 0
  config = tiny.get_config()
  config.dataset.val_size = 0
  with pytest.raises(run_config.ConfigError, match="validation.split"):
    build.Experiment.build(config)
