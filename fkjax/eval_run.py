"""Evaluation of a training run's checkpoint on the test set.

``evaluate_checkpoint(config, workdir)`` restores the run's best (or latest)
checkpoint, measures accuracy under the configured attacks (the paper's
A1..A5 by default) and the sparsity of the evaluated weights, and writes a
self-describing result file whose name says which protocol produced it, so
results of different protocols never overwrite each other:

* ``eval_paper.json`` (``eval_paper_eot{K}.json`` with EOT over K draws,
  ``eval_paper_n{N}.json`` on the first N test images,
  ``eval.num_examples=N``): ``eval.py`` with the paper's protocol;
* ``final_eval.json``: the short evaluation ``train.py`` runs at the end.

A killed evaluation (not train.py's short one) resumes at its next batch
when run again: its finished batches are kept in
``<workdir>/eval_journal/`` (:mod:`fkjax.eval_journal`) until its result
file is written.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Iterator

import jax
import ml_collections

from fkjax import attacks
from fkjax import data as data_lib
from fkjax import eval_journal
from fkjax import evaluate
from fkjax import experiment as experiment_lib
from fkjax import metric_logging
from fkjax import parallel
from fkjax import run_config
from fkjax import workdir as workdir_lib


def limit(split: data_lib.Split, num_examples: int) -> data_lib.Split:
  """The first ``num_examples`` of ``split`` (all of it for 0)."""
  if num_examples and num_examples < len(split.labels):
    return data_lib.Split(split.images[:num_examples],
                          split.labels[:num_examples])
  return split


def sharded_eval_batches(split: data_lib.Split, batch_size: int,
                         mesh) -> Iterator[dict[str, jax.Array]]:
  """Padded, masked evaluation batches placed on the mesh."""
  parallel.check_batch_size(batch_size, mesh)
  for batch in data_lib.eval_batches(
      split, batch_size, process_index=jax.process_index(),
      process_count=jax.process_count()):
    yield parallel.shard_batch(batch, mesh)


def attack_suite(names: str, config: ml_collections.ConfigDict
                 ) -> dict[str, evaluate.Attack]:
  """The attacks named in a comma-separated string, from the eval config."""
  e = config.eval
  every = evaluate.default_attacks(
      eot_samples=e.eot_samples, nattack_iters=e.nattack_iters,
      epsilon=config.attack.epsilon, step_size=config.attack.step_size,
      nattack_population=e.nattack_population, nattack_chunk=e.nattack_chunk,
      nattack_image_chunk=e.nattack_image_chunk,
      unroll=config.attack.unroll, best_so_far=e.best_so_far,
      # a deterministic model needs no fresh draw to check an iterate
      check_draws=1 if config.model.noise_coef else 0,
      nattack_variant=e.nattack_variant,
      nattack_success_draws=e.nattack_success_draws)
  every["cw_authors"] = attacks.cw_authors
  wanted = [n.strip() for n in names.split(",") if n.strip()]
  unknown = sorted(set(wanted) - set(every))
  if unknown:
    raise run_config.ConfigError(
        f"unknown attacks {unknown}; choose from {list(every)}")
  return {name: every[name] for name in wanted}


# Forward passes one gradient costs (forward + backward), for the cost line.
_GRADIENT_COST = 3


def attack_costs(names: list[str], config: ml_collections.ConfigDict
                 ) -> dict[str, int]:
  """Forward-pass equivalents each attack of the paper's protocol costs per
  image at most (a gradient counts 3; NAttack stops early once every image
  of its batch is broken, so it can cost less)."""
  e = config.eval
  eot = e.eot_samples
  check = 1 if config.model.noise_coef and e.best_so_far else 0
  steps = 20
  per_step = _GRADIENT_COST * eot + check
  costs = {"natural": 1, "fgsm": _GRADIENT_COST * eot + 1,
           "ifgsm20": steps * per_step + 1, "cw": steps * per_step + 1,
           "cw_authors": steps * _GRADIENT_COST + 1,
           "nattack": e.nattack_iters * (e.nattack_population
                                         + e.nattack_success_draws) + 1}
  return {name: costs[name] for name in names}


def cost_summary(names: list[str], config: ml_collections.ConfigDict,
                 num_images: int) -> str:
  """What an evaluation will cost, said before it starts, and how to bound
  it: each attack's share of the forward passes, and the flags that cut
  the bulk."""
  costs = attack_costs(names, config)
  total = sum(costs.values())
  shares = ", ".join(f"{name} {cost} ({100 * cost / total:.0f}%)"
                     for name, cost in costs.items())
  batch = config.eval.batch_size
  text = (f"evaluating {num_images} test images in batches of "
          f"{min(batch, num_images)}; forward passes per image (a gradient "
          f"counts 3), at most: {shares}.")
  heavy = max(costs, key=costs.get)
  if costs[heavy] > total / 2 and len(costs) > 1:
    rest = ",".join(n for n in names if n != heavy)
    text += (f" {heavy} is most of the time: --config.eval.attacks={rest} "
             f"leaves it out")
    if heavy == "nattack":
      text += (", --config.eval.nattack_iters=N shortens it (the paper's "
               "is 500)")
    text += (f"; --config.eval.num_examples=N evaluates the first N images "
             f"only (written to its own file).")
  return text + (" A killed evaluation resumes at its next batch: run the "
                 "same command again.")


def validation_attacks(config: ml_collections.ConfigDict
                       ) -> dict[str, evaluate.Attack]:
  """Natural accuracy and, if configured, PGD-k accuracy on validation."""
  suite = {"natural": evaluate.natural}
  steps = config.validation.attack_steps
  if steps:
    suite[f"pgd{steps}"] = functools.partial(
        attacks.pgd, epsilon=config.attack.epsilon,
        step_size=config.attack.step_size, num_steps=steps,
        random_start=False, unroll=config.attack.unroll)
  return suite


def _journal(config: ml_collections.ConfigDict, workdir: str, step: int,
             exp: experiment_lib.Experiment, result_path: str,
             parts: list[str], logger) -> eval_journal.Journal | None:
  """The journal of the evaluation writing ``result_path``: its identity is
  the checkpoint and every setting its numbers depend on; ``parts``: the
  evaluations it runs under their own journals (:meth:`Journal.scoped`).
  Says what an earlier attempt finished. None with several processes (each
  would need the same file)."""
  if jax.process_count() > 1:
    return None
  journal = eval_journal.Journal(
      os.path.join(workdir, eval_journal.JOURNAL_DIR,
                   os.path.basename(result_path)),
      {"checkpoint": config.eval.checkpoint, "step": step,
       "seed": config.seed, "data": exp.dataset.description,
       "eval": config.eval.to_dict(), "attack": config.attack.to_dict(),
       "model": config.model.to_dict()})
  kept = [(part, journal.scoped(part).batches_done()) for part in parts]
  kept = [f"{part}: {done}" for part, done in
          [("main", journal.batches_done())] + kept if done]
  if kept:
    _say(f"resuming the evaluation: batches done by an earlier attempt "
         f"({', '.join(kept)}) are read from {os.path.dirname(journal.path)}",
         logger)
  return journal


def _say(text: str, logger) -> None:
  if logger is not None:
    logger.log_text(text)
  else:
    print(text, flush=True)


def _strong(config, workdir, exp, step, eval_apply, variables, test, logger
            ) -> dict[str, Any]:
  """The strong protocol (``config.eval.protocol="strong"``)."""
  st = config.eval.strong
  stochastic = bool(config.model.noise_coef)
  batch_size = config.eval.batch_size
  sanity = (list(sharded_eval_batches(limit(test, st.sanity_examples),
                                      batch_size, exp.mesh))
            if st.sanity_examples else None)
  path = workdir_lib.eval_result_path(workdir, config)
  parts = [f"seed{s}" for s in range(st.num_seeds)] + (
      ["sanity"] if sanity else [])
  journal = _journal(config, workdir, step, exp, path, parts, logger)
  results = evaluate.strong_evaluation(
      eval_apply, variables,
      lambda: sharded_eval_batches(test, batch_size, exp.mesh),
      experiment_lib.prng_key(config.seed, "test"),
      epsilon=config.attack.epsilon,
      stochastic=stochastic,
      # Draws of a deterministic model would all give the same gradient.
      eot_samples=(st.eot_samples or None) if stochastic else 1,
      num_noise_draws=config.eval.num_noise_draws, num_iters=st.num_iters,
      n_restarts=st.n_restarts, targeted=st.targeted,
      num_targets=st.num_targets, num_seeds=st.num_seeds,
      sanity_batches=sanity,
      sanity_options={"nattack_chunk": config.eval.nattack_chunk,
                      "nattack_image_chunk": config.eval.nattack_image_chunk},
      progress=config.progress,
      num_batches=data_lib.num_eval_batches(len(test.labels), batch_size),
      journal=journal)
  report = experiment_lib.sparsity_report(variables["params"], config)
  results.update(step=step, weight_sparsity=report.weight_sparsity,
                 channel_sparsity=report.channel_sparsity)
  if jax.process_index() == 0:
    workdir_lib.write_results(path, results, workdir_lib.results_metadata(
        config, step=step, data=exp.dataset.description,
        checkpoint=config.eval.checkpoint, protocol="strong",
        devices=experiment_lib.describe_devices(exp.mesh.size)))
  _forget(journal, parts)
  _say(f"strong evaluation of the {config.eval.checkpoint} checkpoint "
       f"(step {step}, {results['num_examples']} images, "
       f"{exp.dataset.description}):\n{evaluate.format_strong(results)}\n"
       f"written to {path}", logger)
  return results


def _forget(journal: eval_journal.Journal | None, parts: list[str]) -> None:
  """Removes the journal's files once the result is written."""
  if journal is None:
    return
  for part in parts:
    journal.scoped(part).remove()
  journal.remove()
  try:
    os.rmdir(os.path.dirname(journal.path))
  except OSError:
    pass   # not empty: another evaluation's journal is there


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str, *,
                        exp: experiment_lib.Experiment | None = None,
                        attacks_csv: str | None = None,
                        plots: bool | None = None,
                        final: bool = False,
                        logger: metric_logging.MetricLogger | None = None
                        ) -> dict[str, Any]:
  """Restores a checkpoint and measures A1..A5 and sparsity on the test set.

  Writes ``fkjax.workdir.eval_result_path(workdir, config, final)`` (and PNG
  plots if asked).
  ``final`` marks train.py's own short evaluation.
  """
  from fkjax import plots as plots_lib  # matplotlib only when needed

  workdir_lib.adopt_subset_result(workdir, config)
  exp, step, state = experiment_lib.restore_checkpoint(workdir, config, exp)
  variables = experiment_lib.eval_variables(state, config)
  eval_apply, _ = experiment_lib.model_fns(exp.model)
  test = limit(exp.dataset.test, config.eval.num_examples)
  if config.eval.protocol == "strong" and not final:
    return _strong(config, workdir, exp, step, eval_apply, variables, test,
                   logger)
  suite = attack_suite(attacks_csv or config.eval.attacks, config)
  num_batches = data_lib.num_eval_batches(len(test.labels),
                                          config.eval.batch_size)
  path = workdir_lib.eval_result_path(workdir, config, final)
  if not final:
    _say(cost_summary(list(suite), config, len(test.labels)), logger)
  dense_part = (["dense_w"] if config.sparsity.method == "admm" and not final
                else [])
  # train.py's short final evaluation is not worth a journal.
  journal = (None if final else
             _journal(config, workdir, step, exp, path, dense_part, logger))
  results = evaluate.robust_accuracy(
      eval_apply, variables,
      sharded_eval_batches(test, config.eval.batch_size, exp.mesh), suite,
      experiment_lib.prng_key(config.seed, "test"),
      num_noise_draws=config.eval.num_noise_draws, progress=config.progress,
      per_image=True, num_batches=num_batches, journal=journal,
      # The progress in forward passes: NAttack's calls cost more.
      work_per_image=attack_costs(list(suite), config))
  # Which images each attack left right: nets evaluated on the same images
  # compare image by image (a paired test, fkjax.reproduce.claims).
  results["correct_per_image"] = {
      name: workdir_lib.encode_correct(v)
      for name, v in results.pop("per_image").items()}
  results["correct_per_image_encoding"] = workdir_lib.CORRECT_ENCODING
  report = experiment_lib.sparsity_report(variables["params"], config)
  results["near_zero"] = experiment_lib.near_zero_shares(variables["params"],
                                                         config)
  if dense_part:
    # The paper's ADMM figures are neither reading exactly: report both the
    # projected u (evaluated above) and the dense w (docs/protocol.md).
    dense = {"params": state["params"], "batch_stats": state["batch_stats"]}
    dense_results = evaluate.robust_accuracy(
        eval_apply, dense,
        sharded_eval_batches(test, config.eval.batch_size, exp.mesh), suite,
        experiment_lib.prng_key(config.seed, "test"),
        num_noise_draws=config.eval.num_noise_draws, progress=config.progress,
        num_batches=num_batches,
        journal=journal.scoped("dense_w") if journal is not None else None)
    dense_report = experiment_lib.sparsity_report(dense["params"], config)
    results["admm_dense_w"] = {
        "attacks": {k: {"accuracy": v["accuracy"]}
                    for k, v in dense_results["attacks"].items()},
        "weight_sparsity": dense_report.weight_sparsity,
        "channel_sparsity": dense_report.channel_sparsity,
        "near_zero": experiment_lib.near_zero_shares(dense["params"], config)}
  results.update(
      protocol=workdir_lib.FINAL if final else config.eval.protocol,
      step=step, eot_samples=config.eval.eot_samples,
      attack_settings={
          "epsilon": config.attack.epsilon,
          "step_size": config.attack.step_size,
          "eot_samples": config.eval.eot_samples,
          "num_noise_draws": config.eval.num_noise_draws,
          "nattack_iters": config.eval.nattack_iters,
          "nattack_population": config.eval.nattack_population},
      weight_sparsity=report.weight_sparsity,
      total_weight_sparsity=report.total_weight_sparsity,
      channel_sparsity=report.channel_sparsity)
  table = evaluate.format_table(results, sparsity=report.weight_sparsity,
                                channel_sparsity=report.channel_sparsity)
  if jax.process_index() == 0:
    workdir_lib.write_results(path, results, workdir_lib.results_metadata(
        config, step=step, data=exp.dataset.description,
        checkpoint=config.eval.checkpoint, protocol=results["protocol"],
        devices=experiment_lib.describe_devices(exp.mesh.size)))
  _forget(journal, dense_part)
  if plots if plots is not None else config.eval.plots:
    results["plots"] = plots_lib.save_all(
        variables["params"], report, os.path.join(workdir, "plots"),
        layout=experiment_lib.kernel_layout(config))
  near = results["near_zero"]
  text = (f"test evaluation of the {config.eval.checkpoint} checkpoint "
          f"(step {step}, {results['num_examples']} images, "
          f"{exp.dataset.description}):\n{table}\n{report.format_table()}\n"
          f"|w| < 1e-3: {near['weights_below_1e-3']:.2f}% of conv weights, "
          f"{near['channels_below_1e-3']:.2f}% of channels")
  if "admm_dense_w" in results:
    d = results["admm_dense_w"]
    text += ("\nADMM, the dense w: " + ", ".join(
        f"{k} {v['accuracy']:.2f}" for k, v in d["attacks"].items())
             + f"; exact zeros {d['weight_sparsity']:.2f}% of weights, "
             f"{d['channel_sparsity']:.2f}% of channels; |w| < 1e-3: "
             f"{d['near_zero']['weights_below_1e-3']:.2f}% of weights, "
             f"{d['near_zero']['channels_below_1e-3']:.2f}% of channels")
  _say(text + f"\nwritten to {path}", logger)
  return results
