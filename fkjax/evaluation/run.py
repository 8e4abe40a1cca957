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
``<workdir>/eval_journal/`` (:mod:`fkjax.evaluation.journal`) until its result
file is written.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterator, Mapping

import jax
import ml_collections

from fkjax import checkpoint as ckpt_lib
from fkjax import data as data_lib
from fkjax.evaluation import cost as eval_cost
from fkjax.evaluation import journal as eval_journal
from fkjax.evaluation import loop as eval_loop
from fkjax.evaluation import memory as eval_memory
from fkjax.evaluation import merge as eval_merge
from fkjax.config import names as eval_names
from fkjax.evaluation import result as eval_result
from fkjax.evaluation import strong as eval_strong
from fkjax.evaluation import suites as eval_suites
from fkjax.evaluation import tables as eval_tables
from fkjax.training import build
from fkjax.training import devices
from fkjax.training import sparsify
from fkjax.workdir import metric_logging
from fkjax.training import parallel
from fkjax.config import record as run_config
from fkjax import workdir as workdir_lib


def _journal(config: ml_collections.ConfigDict, workdir: str, step: int,
             exp: build.Experiment, result_path: str,
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


@dataclasses.dataclass
class Restored:
  """What an evaluation evaluates: the checkpoint restored, and how."""
  config: ml_collections.ConfigDict
  workdir: str
  exp: build.Experiment
  step: int
  state: Any
  variables: Any   # the evaluated ones (ADMM's projected u)
  eval_apply: Callable[..., Any]
  test: data_lib.Split
  final: bool
  logger: metric_logging.MetricLogger | None

  def batches(self) -> Iterator[dict[str, jax.Array]]:
    """The test batches, placed on the mesh."""
    return parallel.eval_batches(self.test, self.config.eval.batch_size,
                                self.exp.mesh)

  def num_batches(self) -> int:
    return data_lib.num_eval_batches(len(self.test.labels),
                                     self.config.eval.batch_size)

  def key(self) -> jax.Array:
    return build.prng_key(self.config.seed, "test")

  def say(self, text: str) -> None:
    _say(text, self.logger)

  def write(self, path: str, results: dict[str, Any], protocol: str, *,
            merge: bool = False) -> dict[str, Any]:
    """Writes the self-describing result file (process 0 only); with
    ``merge``, keeping the earlier file's attacks that ``results`` lacks;
    an earlier file of other settings is kept in the new one's
    ``"earlier"`` (:mod:`fkjax.evaluation.merge`, said in a line). Returns
    what was written, without its metadata."""
    if jax.process_index() != 0:
      return results
    metadata = workdir_lib.results_metadata(
        self.config, step=self.step, data=self.exp.dataset.description,
        checkpoint=self.config.eval.checkpoint, protocol=protocol,
        devices=devices.describe_devices(self.exp.mesh.size))
    # Every write goes through merge: an earlier file made under other
    # settings is kept in the new one (never replaced), whatever merges.
    with workdir_lib.results_lock(os.path.dirname(os.path.abspath(path))):
      results, remark = eval_merge.merge(workdir_lib.read_results(path),
                                         results, metadata,
                                         keep_attacks=merge)
      workdir_lib.write_results(path, results, metadata)
    if remark is not None:
      self.say(f"{os.path.basename(path)}: {remark}")
    return results

  def log_test(self, path: str, accuracies: Mapping[str, float],
               report: Any) -> None:
    """The evaluation's accuracies (A1..A5) and sparsity in TensorBoard,
    at the checkpoint's step, tagged by its result file
    (``eval_paper/natural_accuracy``; process 0 only)."""
    if jax.process_index() != 0:
      return
    stem = os.path.splitext(os.path.basename(path))[0]
    scalars = {f"{stem}/{name}_accuracy": value
               for name, value in accuracies.items()}
    scalars[f"{stem}/weight_sparsity"] = report.weight_sparsity
    scalars[f"{stem}/channel_sparsity"] = report.channel_sparsity
    logger = self.logger or metric_logging.MetricLogger(self.workdir)
    logger.write_test(self.step, scalars)
    if logger is not self.logger:
      logger.close()


def restore(config: ml_collections.ConfigDict, workdir: str, *,
            exp: build.Experiment | None = None, final: bool = False,
            logger: metric_logging.MetricLogger | None = None) -> Restored:
  """Restores the run's checkpoint for evaluation on its test images."""
  with ckpt_lib.Checkpointer(workdir, must_exist=True) as checkpointer:
    exp = exp or build.Experiment.build(config)
    step, state = exp.restore(checkpointer, config.eval.checkpoint)
  eval_apply, _ = build.model_fns(exp.model)
  test = data_lib.limit(exp.dataset.test, config.eval.num_examples)
  eval_memory.check_host_batches(config, exp.dataset._replace(test=test))
  return Restored(config, workdir, exp, step, state,
                  sparsify.eval_variables(state, config), eval_apply,
                  test, final, logger)


def _strong(r: Restored, **unused: Any) -> dict[str, Any]:
  """The strong protocol (``config.eval.protocol="strong"``)."""
  del unused
  config = r.config
  st = config.eval.strong
  stochastic = bool(config.model.noise_coef)
  sanity = (list(parallel.eval_batches(
      data_lib.limit(r.test, st.sanity_examples), config.eval.batch_size,
      r.exp.mesh)) if st.sanity_examples else None)
  path = workdir_lib.eval_result_path(r.workdir, config)
  parts = [f"seed{s}" for s in range(st.num_seeds)] + (
      ["sanity"] if sanity else [])
  journal = _journal(config, r.workdir, r.step, r.exp, path, parts,
                     r.logger)
  result = eval_strong.strong_evaluation(
      r.eval_apply, r.variables, r.batches, r.key(),
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
      progress=config.progress, num_batches=r.num_batches(),
      journal=journal)
  report = sparsify.sparsity_report(r.variables["params"], config)
  results = {**result.to_json(), "step": r.step,
             "weight_sparsity": report.weight_sparsity,
             "channel_sparsity": report.channel_sparsity}
  r.write(path, results, "strong")
  _forget(journal, parts)
  r.say(f"strong evaluation of the {config.eval.checkpoint} checkpoint "
        f"(step {r.step}, {result.num_examples} images, "
        f"{r.exp.dataset.description}):\n"
        f"{eval_tables.format_strong(result)}\nwritten to {path}")
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


def _paper_accuracy(r: Restored, variables: Any,
                    suite: dict[str, eval_suites.Attack],
                    journal: eval_journal.Journal | None,
                    per_image: bool) -> eval_result.EvalResult:
  """``robust_accuracy`` of ``variables`` on the test batches."""
  return eval_loop.robust_accuracy(
      r.eval_apply, variables, r.batches(), suite, r.key(),
      num_noise_draws=r.config.eval.num_noise_draws,
      progress=r.config.progress, per_image=per_image,
      num_batches=r.num_batches(), journal=journal,
      batch_key="config.eval.batch_size",
      # The progress in forward passes: NAttack's calls cost more.
      work_per_image=eval_cost.attack_costs(list(suite), r.config))


def _admm_dense_w(r: Restored, suite: dict[str, eval_suites.Attack],
                  journal: eval_journal.Journal | None) -> dict[str, Any]:
  """The paper's ADMM figures are neither reading exactly: besides the
  projected u, the dense w's accuracies and sparsity (docs/protocol.md)."""
  dense = {"params": r.state["params"],
           "batch_stats": r.state["batch_stats"]}
  results = _paper_accuracy(
      r, dense, suite,
      journal.scoped("dense_w") if journal is not None else None,
      per_image=False)
  report = sparsify.sparsity_report(dense["params"], r.config)
  return {"attacks": {k: {"accuracy": v}
                      for k, v in results.accuracies().items()},
          "weight_sparsity": report.weight_sparsity,
          "channel_sparsity": report.channel_sparsity,
          "near_zero": sparsify.near_zero_shares(dense["params"],
                                                       r.config)}


def _paper_record(r: Restored, report: Any) -> dict[str, Any]:
  """The settings and sparsity a paper-protocol result file records."""
  config = r.config
  return dict(
      protocol=workdir_lib.FINAL if r.final else config.eval.protocol,
      step=r.step, eot_samples=config.eval.eot_samples,
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


def _paper_text(r: Restored, result: eval_result.EvalResult,
                results: dict[str, Any], report: Any, path: str) -> str:
  """What a paper-protocol evaluation prints (``results``: its file's
  content): its row, the sparsity."""
  table = eval_tables.format_table(result, sparsity=report.weight_sparsity,
                                   channel_sparsity=report.channel_sparsity)
  near = results["near_zero"]
  text = (f"test evaluation of the {r.config.eval.checkpoint} checkpoint "
          f"(step {r.step}, {results['num_examples']} images, "
          f"{r.exp.dataset.description}):\n{table}\n"
          f"{report.format_table()}\n"
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
  return text + f"\nwritten to {path}"


def _paper(r: Restored, *, attacks_csv: str | None = None,
           plots: bool | None = None) -> dict[str, Any]:
  """The paper's protocol (A1..A5, or ``config.eval.attacks``), and
  train.py's short final evaluation."""
  from fkjax.evaluation import plots as plots_lib  # matplotlib only when needed

  config = r.config
  suite = eval_suites.attack_suite(attacks_csv or config.eval.attacks,
                                   config)
  path = workdir_lib.eval_result_path(r.workdir, config, r.final)
  if not r.final:
    r.say(eval_cost.cost_summary(list(suite), config, len(r.test.labels)))
  dense_part = (["dense_w"] if config.sparsity.method == "admm"
                and not r.final else [])
  # train.py's short final evaluation is not worth a journal.
  journal = (None if r.final else _journal(
      config, r.workdir, r.step, r.exp, path, dense_part, r.logger))
  result = _paper_accuracy(r, r.variables, suite, journal, per_image=True)
  # Which images each attack left right (to_json's correct_per_image): nets
  # evaluated on the same images compare image by image (a paired test, the
  # reproduction's claims).
  results = result.to_json()
  report = sparsify.sparsity_report(r.variables["params"], config)
  results["near_zero"] = sparsify.near_zero_shares(
      r.variables["params"], config)
  if dense_part:
    results["admm_dense_w"] = _admm_dense_w(r, suite, journal)
  results.update(_paper_record(r, report))
  results = r.write(path, results, results["protocol"], merge=True)
  r.log_test(path, result.accuracies(), report)
  _forget(journal, dense_part)
  if plots if plots is not None else config.eval.plots:
    results["plots"] = plots_lib.save_all(
        r.variables["params"], report, os.path.join(r.workdir, "plots"),
        layout=sparsify.kernel_layout(config))
  r.say(_paper_text(r, result, results, report, path))
  return results


# Protocol name -> how it evaluates a restored checkpoint. A name not
# registered is a further paper-protocol evaluation kept in its own file
# (``fkjax.config.record``'s rule for ``eval.protocol``).
PROTOCOLS: dict[str, Callable[..., dict[str, Any]]] = {
    "paper": _paper,
    "strong": _strong,
}


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str, *,
                        exp: build.Experiment | None = None,
                        attacks_csv: str | None = None,
                        plots: bool | None = None,
                        final: bool = False,
                        logger: metric_logging.MetricLogger | None = None
                        ) -> dict[str, Any]:
  """Restores a checkpoint and evaluates it under ``config.eval.protocol``
  (``PROTOCOLS``; the paper's A1..A5 and sparsity by default).

  Writes ``fkjax.workdir.eval_result_path(workdir, config, final)`` (and PNG
  plots if asked). ``final`` marks train.py's own short evaluation (the
  paper's protocol, whatever ``config.eval.protocol`` says).

  Returns:
    The file's content without its metadata: for the paper's protocol the
    evaluation's ``EvalResult.to_json()`` (``EvalResult.from_json`` reads it
    back) with the sparsity and settings beside it; for the strong
    protocol ``StrongResult.to_json()`` (``StrongResult.from_json`` reads
    it back) with the step and sparsity beside it.
  """
  workdir_lib.adopt_subset_result(workdir, config)
  # The file the result merges into, read now: a damaged one is named
  # before the evaluation, not after its hours.
  workdir_lib.read_results(workdir_lib.eval_result_path(workdir, config,
                                                        final=final))
  restored = restore(config, workdir, exp=exp, final=final, logger=logger)
  protocol = "paper" if final else config.eval.protocol
  run = PROTOCOLS.get(protocol, PROTOCOLS["paper"])
  return run(restored, attacks_csv=attacks_csv, plots=plots)
