"""Exports a trained, channel-pruned checkpoint as a smaller dense network.

  python export.py --workdir=/tmp/run
  python export.py --workdir=... --out=/tmp/run/slim_nonoise --noise=false

An existing ``<out>`` is refused in one line unless it is empty or an earlier
export, of which only those three are replaced (anything else the folder
holds stays; ``fkjax.slim.destination``).

The run's own ``config.json`` says what is exported (as for eval.py,
``--config.eval.checkpoint=latest`` and other evaluation keys may be
overridden). Writes ``<out>`` (default
``<workdir>/slim``): ``architecture.json`` (every layer's kept channels),
``variables/`` (orbax) and ``costs.json`` (parameters and multiply-adds per
layer, before and after), prints the cost table, and checks on test images
that the saved model, loaded back, gives the checkpoint's logits (same noise
key). Load it with ``fkjax.slim.load_slim(out)`` (docs/slim.md).
"""
# First, before the imports below (seconds): Ctrl-C, or a missing package of
# the [train] extra, during them is one line (fkjax.entry).
from fkjax import entry
if __name__ == "__main__":
  entry.start()
# pylint: disable=wrong-import-position

import os

from absl import flags

from fkjax import cli
from fkjax import oserrors

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory that train.py wrote.")
flags.DEFINE_string("out", None, "Output directory (default <workdir>/slim).")
flags.DEFINE_bool("noise", True,
                  "Keep the noise injection (exact, noised tensors keep their "
                  "width); false: the deterministic network (add_noise=False).")
flags.DEFINE_integer("check_examples", 250,
                     "Test images the logits are compared on (0: none).",
                     lower_bound=0)
cli.define_config_file(
    "config", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "configs", "default.py"),
    "Optional: the config file the run was trained with (checked against "
    "the run's config.json).", lock_config=False)
flags.mark_flags_as_required(["workdir"])


def restore_pruned(config, workdir: str):
  """``(experiment, step, variables)``: the checkpoint eval.py evaluates.

  The only use of fkjax's training code here: the experiment built from the config,
  its checkpoint restored, the variables evaluated (the sparse ``u`` of
  RVSM/RGSM).
  """
  from fkjax import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from fkjax.training import build  # pylint: disable=import-outside-toplevel
  from fkjax.training import sparsify  # pylint: disable=import-outside-toplevel
  with ckpt_lib.Checkpointer(workdir, must_exist=True) as checkpointer:
    exp = build.Experiment.build(config)
    step, state = exp.restore(checkpointer, config.eval.checkpoint)
  return exp, int(step), sparsify.eval_variables(state, config)


def main(argv):
  config = cli.run_config_for_eval(argv, FLAGS.workdir, FLAGS["config"])
  import dataclasses
  import json
  import jax
  import numpy as np

  from fkjax import slim
  from fkjax.checkpoint import writing
  from fkjax.slim import destination

  out = FLAGS.out or os.path.join(FLAGS.workdir, "slim")
  destination.check(out)   # before any work
  oserrors.declare("--workdir", FLAGS.workdir)
  oserrors.declare("--out" if FLAGS.out else "--workdir", out, write=True)
  exp, step, variables = restore_pruned(config, FLAGS.workdir)
  small, small_vars = slim.slim(exp.model, variables, noise=FLAGS.noise)

  specs = slim.specs_of(small)
  image_size = exp.dataset.test.images.shape[1:3]
  costs = slim.cost_report(specs, image_size)
  staged = destination.staging(out)
  try:
    # A full disk, or Ctrl-C, during orbax's write: one line.
    with writing.one_line(lambda cause: destination.write_error(out, cause)):
      slim.save_slim(staged, small, small_vars, source=os.path.abspath(
          FLAGS.workdir), checkpoint=config.eval.checkpoint, step=int(step))
    with open(os.path.join(staged, destination.COSTS), "w") as f:
      json.dump({"image_size": list(image_size),
                 "totals": slim.totals(costs),
                 "layers": [dataclasses.asdict(c) for c in costs]}, f,
                indent=1)
  except BaseException:
    destination.discard(staged)   # Ctrl-C, a full disk
    raise
  out = destination.install(staged, out)
  print(f"slim model of the {config.eval.checkpoint} checkpoint (step "
        f"{step}) written to {out}\n" + slim.format_costs(costs))

  n = min(FLAGS.check_examples, len(exp.dataset.test.labels))
  if n:
    from fkjax import data
    images = data.to_float(exp.dataset.test.images[:n])
    key = jax.random.key(config.seed)
    apply_fn, loaded = slim.load_slim(out)
    add_noise = FLAGS.noise
    original = jax.jit(lambda v, x, k: exp.model.apply(
        v, x, train=False, add_noise=add_noise, rngs={"noise": k}))(
            variables, images, key)
    mine = jax.jit(apply_fn)(loaded, images, key)
    diff = float(np.max(np.abs(np.asarray(original) - np.asarray(mine))))
    agree = float(np.mean(np.argmax(original, -1) == np.argmax(mine, -1)))
    print(f"check on {n} test images (noise {'on' if add_noise else 'off'}, "
          f"same key): max |logit difference| {diff:.3g}, same prediction "
          f"for {100 * agree:.1f}%")


if __name__ == "__main__":
  cli.run(main)
