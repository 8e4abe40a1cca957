"""The paper's claims, judged from the result tables: ``claims.{json,md}``.

Each claim is a list of comparisons between two rows of a table, in the
direction the paper states ("A's metric is higher than B's"). A comparison
is judged only from ``results/<scale>/<table>.json`` (what the runner
wrote), never from anything typed here:

* ``not yet run``: one of the two rows has no finished run;
* ``holds`` / ``reversed``: both rows have at least ``MIN_SEEDS`` seeds
  and the difference of their means exceeds ``Z`` standard errors (from the
  seeds' spread) in the paper's direction / against it;
* ``no resolved difference``: enough seeds, the difference within ``Z``
  standard errors;
* ``as the paper (unresolved)`` / ``against the paper (unresolved)``:
  fewer seeds. An accuracy difference smaller than ``Z`` standard errors of
  the test sample is ``within test-sample noise`` whatever the seeds: no
  number of seeds makes it a finding on that many images.

The test sample's standard error is paired where it can be: when at least
one finished seed of each row kept which test images it got right (the
same images for all), it is that of the mean over images of ``d_i``, the
difference of the two rows' correctness on image ``i`` averaged over those
seeds (``sd(d) / sqrt(N)``). Two nets mostly right and wrong on the same
images differ far less from one test sample to another than two
independent samples would, so this resolves smaller gaps. Seeds that did
not keep their images (runs evaluated before fkjax kept them) are left out
of ``d`` only: a row averaged over fewer seeds disagrees more with the
other image by image, so the noise is overstated, never understated.
Otherwise it is the binomial standard error of two independent samples.

A sparsity comparison is flagged when a run's evaluated checkpoint (the
best natural validation accuracy) is from before its last epoch and the
sparsity its training log gives for the last epoch would turn the
comparison round: a short schedule may select a net from before the
sparsifier pruned.

An accuracy comparison is flagged when a run's evaluated checkpoint is
barely pruned (under a tenth of the weights or channels its last epoch has
pruned): the accuracy is then of a net from before the sparsifier acted,
not of the sparse net the row stands for.

A claim holds when every comparison holds, does not hold when one is
reversed, and is otherwise labelled by what its comparisons show so far.
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any, Mapping

import numpy as np

from fkjax import atomic
from fkjax import workdir as workdir_lib
from reproduce.report import claims_figure
from reproduce import files
from reproduce.spec import scales as scales_lib
from reproduce.spec import tables as tables_lib

MIN_SEEDS = 3
FIGURE = "claims.png"
# A sparsity column and what the run's training log says of it at the last
# epoch (reproduce.report.report: runs evaluated at an earlier checkpoint).
LAST_EPOCH = {"sparsity": "last_epoch_sparsity",
              "channel_sparsity": "last_epoch_channel_sparsity"}
Z = 2.0
ACCURACIES = ("A1", "A2", "A3")
NOT_RUN = "not yet run"
# The prefix of a verdict that neither holds nor does not hold (verdict_of).
OPEN = "open"


@dataclasses.dataclass(frozen=True)
class Comparison:
  """``table``'s row ``higher`` has a larger ``metric`` than row ``lower``
  (its ``lower_metric`` where given: another reading of the same thing)."""
  table: str
  higher: str
  lower: str
  metric: str
  lower_metric: str | None = None


@dataclasses.dataclass(frozen=True)
class Claim:
  """A finding of the paper (``text``, stated in ``where``) as comparisons."""
  name: str
  text: str
  where: str
  comparisons: tuple[Comparison, ...]


def _pairs(table: str, pairs: list[tuple[str, str]],
           metrics: tuple[str, ...]) -> tuple[Comparison, ...]:
  return tuple(Comparison(table, a, b, m) for a, b in pairs for m in metrics)


_RVSM = [(f"en2resnet20_rvsm_b{b}", f"resnet20_rvsm_b{b}")
         for b in ("0.01", "0.1", "0.5")]
_RGSM = [(f"en2resnet20_rgsm_l{l}", f"resnet20_rgsm_l{l}")
         for l in ("0.05", "0.1")]
_VS38 = [(f"en2resnet20_{s}", f"resnet38_{s}")
         for s in ("none", "rgsm_l0.05", "rgsm_l0.1")]
_SKIP = [("resnet20_skip", "resnet20_noskip"),
         ("en2resnet20_skip", "en2resnet20_noskip")]

CLAIMS: tuple[Claim, ...] = (
    Claim("at_denser",
          "Adversarial training makes weights denser: a smaller share of "
          "conv weights of magnitude below 1e-3 than natural training",
          "Sec. 3 (ResNet20: NT 8.66%, AT 3.64%)",
          _pairs("sec3", [("resnet20_nt", "resnet20_at"),
                          ("en5resnet20_nt", "en5resnet20_at")],
                 ("small_share",))),
    Claim("en_sparser_rvsm",
          "Under RVSM, En2ResNet20's weights are sparser than ResNet20's",
          "Table 1", _pairs("table1", _RVSM, ("sparsity",))),
    Claim("en_more_accurate_rvsm",
          "Under RVSM, En2ResNet20 is more accurate and robust than ResNet20",
          "Table 1", _pairs("table1", _RVSM, ACCURACIES)),
    Claim("en_sparser_rgsm",
          "Under RGSM, En2ResNet20 has more channels pruned than ResNet20",
          "Table 2", _pairs("table2", _RGSM, ("channel_sparsity",))),
    Claim("en_more_accurate",
          "En2ResNet20 is more accurate and robust than ResNet20, unpruned "
          "and under RGSM",
          "Table 2", _pairs("table2", [("en2resnet20_none", "resnet20_none"),
                                       *_RGSM], ACCURACIES)),
    Claim("en5_over_en2",
          "At similar channel sparsity (~55%), En5ResNet20 is more accurate "
          "and robust than En2ResNet20",
          "Table 2 (En5 lambda1 0.02 vs En2 lambda1 0.1)",
          _pairs("table2", [("en5resnet20_rgsm_l0.02",
                             "en2resnet20_rgsm_l0.1")], ACCURACIES)),
    Claim("en2_over_resnet38_sparsity",
          "Under RGSM, En2ResNet20 has more channels pruned than the "
          "equal-size ResNet38",
          "Table 3", _pairs("table3", _VS38[1:], ("channel_sparsity",))),
    Claim("en2_over_resnet38_accuracy",
          "En2ResNet20 is more accurate and robust than the equal-size "
          "ResNet38, unpruned and under RGSM",
          "Table 3", _pairs("table3", _VS38, ACCURACIES)),
    Claim("en2_sparsity_grows_faster",
          "At every lambda1, En2ResNet20's channel sparsity is above "
          "ResNet38's",
          "Fig. 4", _pairs("fig45", [(f"en2resnet20_rgsm_l{l}",
                                      f"resnet38_rgsm_l{l}")
                                     for l in ("0.02", "0.05", "0.1", "0.2")],
                           ("channel_sparsity",))),
    # The paper counts ADMM's zeros in its trained weights w (fkjax's
    # projection is exactly `percent` % zero by construction) and reports
    # the accuracy of w; fkjax evaluates the projection, the net that is
    # actually pruned (docs/protocol.md).
    Claim("rvsm_sparser_than_admm",
          "RVSM prunes more weights than ADMM (unstructured), counting the "
          "exact zeros of the trained weights w as the paper does",
          "Table 4", (Comparison("table4", "rvsm", "admm_element",
                                 "w_sparsity"),)),
    Claim("rgsm_beats_admm_channels",
          "RGSM prunes more channels than ADMM (zero channels of the trained "
          "weights w) and is more accurate and robust than both ADMM's "
          "pruned projection and its dense w (the paper's reading)",
          "Table 4", (Comparison("table4", "rgsm", "admm_channel",
                                 "w_channel_sparsity"),
                      *_pairs("table4", [("rgsm", "admm_channel")],
                              ACCURACIES),
                      *(Comparison("table4", "rgsm", "admm_channel", m,
                                   f"w_{m}") for m in ACCURACIES))),
    Claim("skip_connections_matter",
          "Removing the skip connections lowers accuracy and robustness",
          "Table 5", _pairs("table5", _SKIP, ACCURACIES)),
    Claim("ensemble_helps_without_skip",
          "Without skip connections, En2ResNet20 is still more accurate and "
          "robust than ResNet20",
          "Tables 5-6", (*_pairs("table5", [("en2resnet20_noskip",
                                             "resnet20_noskip")], ACCURACIES),
                         *_pairs("table6", [
                             ("en2resnet20_noskip_rvsm",
                              "resnet20_noskip_rvsm"),
                             ("en2resnet20_noskip_rgsm",
                              "resnet20_noskip_rgsm")], ACCURACIES))),
    Claim("en_sparser_without_skip",
          "Without skip connections, En2ResNet20 is sparser than ResNet20 "
          "under RVSM (weights) and RGSM (channels)",
          "Table 6", (Comparison("table6", "en2resnet20_noskip_rvsm",
                                 "resnet20_noskip_rvsm", "sparsity"),
                      Comparison("table6", "en2resnet20_noskip_rgsm",
                                 "resnet20_noskip_rgsm", "channel_sparsity"))),
    Claim("cifar100_en_better",
          "On CIFAR-100, En2ResNet20 is more accurate, robust and "
          "channel-sparse than ResNet20 under RGSM",
          "Table 7", (*_pairs("table7", _RGSM, ACCURACIES),
                      *_pairs("table7", _RGSM, ("channel_sparsity",)))),
)


def _row_stats(table: Mapping[str, Any] | None, row: str, metric: str
               ) -> dict[str, Any] | None:
  """Mean, std, seeds and test images of ``metric`` in ``row``, or None."""
  if table is None:
    return None
  for r in table.get("rows", ()):
    if r["name"] != row:
      continue
    summary = r.get("summary", {}).get(metric)
    if not summary:
      return None
    done = [e for e in r.get("runs", ()) if e.get("status") == "done"]
    images = [e["test_images"] for e in done if e.get("test_images")]
    out = {**summary, "images": min(images) if images else None}
    done = [e for e in done if metric in e.get("metrics", {})]
    if metric in LAST_EPOCH:
      out["early"] = [f"seed {e['seed']} at epoch {e['checkpoint_epoch']}/"
                      f"{e['epochs']}" for e in done
                      if LAST_EPOCH[metric] in e]
      out["last_epoch_mean"] = statistics.fmean(
          e.get(LAST_EPOCH[metric], e["metrics"][metric]) for e in done)
    else:
      out["barely_pruned"] = [note for note in map(_barely_pruned, done)
                              if note]
    return out
  return None


def _row_correct(table: Mapping[str, Any] | None, row: str, metric: str
                 ) -> tuple[np.ndarray, int, int] | None:
  """``row``'s correctness per test image under ``metric``'s attack,
  averaged over the finished seeds that kept it (1: each of them right),
  with how many seeds kept it and how many finished; None unless at least
  one did and every finished seed was evaluated on as many images."""
  for r in (table or {}).get("rows", ()):
    if r["name"] != row:
      continue
    done = [e for e in r.get("runs", ()) if e.get("status") == "done"]
    sizes = {e.get("test_images") for e in done}
    kept = [k for k in (e.get("correct_per_image", {}).get(metric)
                        for e in done) if k is not None]
    if not kept or len(sizes) != 1 or None in sizes:
      return None
    (size,) = sizes
    return (np.mean([workdir_lib.decode_correct(k, size) for k in kept],
                    axis=0), len(kept), len(done))
  return None


def _sample_se(comparison: Comparison, table: Mapping[str, Any],
               a: Mapping[str, Any], b: Mapping[str, Any]
               ) -> tuple[float, list[list[int]] | None]:
  """The test sample's standard error of the difference (percentage
  points) and, when it is paired (module docstring), the seeds it pairs:
  ``[[kept, finished] of the higher row, [kept, finished] of the lower]``."""
  if comparison.lower_metric is None:
    x = _row_correct(table, comparison.higher, comparison.metric)
    y = _row_correct(table, comparison.lower, comparison.metric)
    if (x is not None and y is not None and x[0].size == y[0].size
        and x[0].size > 1):
      d = 100.0 * (x[0] - y[0])
      return (float(np.std(d, ddof=1) / math.sqrt(d.size)),
              [list(x[1:]), list(y[1:])])
  p = (a["mean"] + b["mean"]) / 200.0
  return 100.0 * math.sqrt(p * (1.0 - p) * (1.0 / a["images"]
                                            + 1.0 / b["images"])), None


# Below this share of its last epoch's sparsity, a run's evaluated
# checkpoint counts as from before its sparsifier pruned.
BARELY_PRUNED = 0.1


def _barely_pruned(run: Mapping[str, Any]) -> str | None:
  """Where ``run`` was evaluated at a checkpoint with under BARELY_PRUNED
  of the weights or channels its last epoch has pruned (report.collect's
  last-epoch sparsities), says so; else None."""
  # the kind of sparsity the sparsifier mostly produced: channels (RGSM)
  # or weights (RVSM)
  metric = max(LAST_EPOCH, key=lambda k: run.get(LAST_EPOCH[k]) or 0.0)
  last = run.get(LAST_EPOCH[metric]) or 0.0
  now = run["metrics"].get(metric, 0.0)
  if last <= 0 or now >= BARELY_PRUNED * last:
    return None
  what = "channels" if metric == "channel_sparsity" else "weights"
  return (f"seed {run['seed']} at epoch {run['checkpoint_epoch']}/"
          f"{run['epochs']}, {now:.2f}% of {what} pruned against {last:.2f}% "
          "at the last")


def _paper_value(table: Mapping[str, Any] | None, row: str, metric: str
                 ) -> float | None:
  """The paper's ``metric`` for ``row`` (transcribed in the results table),
  or None where the paper gives none. A reading of the trained weights w
  (``w_A1``, ``w_sparsity``, ...) is the paper's own number: the paper
  evaluated and counted w."""
  for r in (table or {}).get("rows", ()):
    if r["name"] == row:
      return (r.get("paper") or {}).get(metric.removeprefix("w_"))
  return None


def judge(comparison: Comparison, table: Mapping[str, Any] | None
          ) -> dict[str, Any]:
  """The verdict on one comparison from its table's results data."""
  a = _row_stats(table, comparison.higher, comparison.metric)
  b = _row_stats(table, comparison.lower,
                 comparison.lower_metric or comparison.metric)
  out: dict[str, Any] = dataclasses.asdict(comparison)
  paper = [_paper_value(table, row, metric) for row, metric in (
      (comparison.higher, comparison.metric),
      (comparison.lower, comparison.lower_metric or comparison.metric))]
  if None not in paper:
    out["paper_difference"] = paper[0] - paper[1]
  if a is None or b is None:
    return {**out, "verdict": NOT_RUN,
            "seeds": [a["n"] if a else 0, b["n"] if b else 0]}
  diff = a["mean"] - b["mean"]
  out.update(higher_mean=a["mean"], lower_mean=b["mean"], difference=diff,
             seeds=[a["n"], b["n"]])
  if a.get("early") or b.get("early"):
    # The selection rule (best validation accuracy) picked a checkpoint
    # from before the last epoch: where the last epoch's sparsity would
    # turn the comparison round, the reader must know.
    last = a["last_epoch_mean"] - b["last_epoch_mean"]
    if (last > 0) != (diff > 0):
      out["early_checkpoints"] = {
          "difference_at_last_epoch": last,
          "runs": {row: stats["early"] for row, stats in
                   ((comparison.higher, a), (comparison.lower, b))
                   if stats["early"]}}
  barely = {row: stats["barely_pruned"] for row, stats in
            ((comparison.higher, a), (comparison.lower, b))
            if stats.get("barely_pruned")}
  if barely:
    out["barely_pruned_checkpoints"] = barely
  if comparison.metric in ACCURACIES and a["images"] and b["images"]:
    # The floor below which no seed count makes a difference real.
    noise, paired_seeds = _sample_se(comparison, table, a, b)
    out.update(sample_se=noise, paired=paired_seeds is not None)
    if paired_seeds is not None:
      out["paired_seeds"] = paired_seeds
    if abs(diff) <= Z * noise:
      return {**out, "verdict": "within test-sample noise"}
  if min(a["n"], b["n"]) >= MIN_SEEDS:
    se = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
    out["seed_se"] = se
    if abs(diff) <= Z * se:
      return {**out, "verdict": "no resolved difference"}
    return {**out, "verdict": "holds" if diff > 0 else "reversed"}
  return {**out, "verdict": ("as the paper" if diff > 0 else
                             "against the paper") + " (unresolved)"}


def verdict_of(verdicts: list[str], turned: int = 0,
               barely_pruned: int = 0) -> str:
  """A claim's verdict from its comparisons' verdicts; ``turned``: how many
  of them the last epoch's sparsity would turn round, ``barely_pruned``:
  how many compare accuracies of a net evaluated barely pruned
  (``judge``)."""
  if all(v == NOT_RUN for v in verdicts):
    return NOT_RUN
  if any(v == "reversed" for v in verdicts):
    verdict = "does not hold"
  elif all(v == "holds" for v in verdicts):
    verdict = "holds"
  else:
    counts: dict[str, int] = {}
    for v in verdicts:
      counts[v] = counts.get(v, 0) + 1
    verdict = f"{OPEN}: " + ", ".join(f"{n} {v}" for v, n in counts.items())
  if turned:
    verdict += (f"; {turned} of them on a checkpoint before the last epoch, "
                "whose sparsity goes the other way" if turned > 1 else
                "; 1 on a checkpoint before the last epoch, whose sparsity "
                "goes the other way")
  if barely_pruned:
    verdict += (f"; {barely_pruned} of them with a row evaluated at a "
                "checkpoint its sparsifier had barely pruned"
                if barely_pruned > 1 else
                "; 1 with a row evaluated at a checkpoint its sparsifier had "
                "barely pruned")
  return verdict


def evaluate(results_dir: str, scale: str) -> dict[str, Any]:
  """Every claim judged from ``<results_dir>/<scale>/<table>.json``."""
  tables: dict[str, Any] = {}
  out = []
  for claim in CLAIMS:
    comparisons = []
    for c in claim.comparisons:
      if c.table not in tables:
        tables[c.table] = files.load_json(
            os.path.join(results_dir, scale, f"{c.table}.json"),
            files.TABLE)
      comparisons.append(judge(c, tables[c.table]))
    out.append({"name": claim.name, "claim": claim.text, "where": claim.where,
                "verdict": verdict_of(
                    [c["verdict"] for c in comparisons],
                    sum("early_checkpoints" in c for c in comparisons),
                    sum("barely_pruned_checkpoints" in c for c in comparisons)),
                "comparisons": comparisons})
  return {"scale": scale, "min_seeds": MIN_SEEDS, "z": Z,
          "accuracies": list(ACCURACIES), "claims": out,
          "to_settle": to_settle(out)}


def to_settle(judged: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The runs that would settle the open claims: per table, the rows of
  their unresolved or unrun comparisons that have fewer than ``MIN_SEEDS``
  seeds, with the claims waiting on them.

  A comparison within test-sample noise is settled whatever its seeds, and
  a claim that holds or does not hold needs nothing more.
  """
  wanted: dict[str, dict[str, list[str]]] = {}
  for claim in judged:
    if claim["verdict"] in ("holds", "does not hold"):
      continue
    for c in claim["comparisons"]:
      if not (c["verdict"] == NOT_RUN or c["verdict"].endswith(
          "(unresolved)")):
        continue
      for row, n in zip((c["higher"], c["lower"]), c["seeds"]):
        if n < MIN_SEEDS:
          # A shared row is trained by its owner's command.
          table = c["table"]
          entry = tables_lib.TABLES[table].row(row)
          if entry.shared:
            owner_table, owner = tables_lib.resolve_shared(entry)
            table, row = owner_table.name, owner.name
          names = wanted.setdefault(table, {}).setdefault(row, [])
          if claim["name"] not in names:
            names.append(claim["name"])
  return [{"table": table, "rows": list(rows),
           "claims": list(dict.fromkeys(n for v in rows.values() for n in v))}
          for table, rows in wanted.items()]


def markdown(data: Mapping[str, Any]) -> str:
  """``claims.md``: the verdicts, then every comparison that has run."""
  lines = [
      f"# The paper's claims at the `{data['scale']}` scale",
      "",
      "Generated by `python -m reproduce claims "
      f"{scales_lib.command_flags(data['scale'])}` from the result tables "
      "beside this file "
      "(rules: `reproduce/report/claims.py`). A difference is resolved with "
      f"at least {data['min_seeds']} seeds per row and more than "
      f"{data['z']:g} standard errors; accuracies are A1-A3 on the rows' "
      "test images, and a gap within the test sample's noise (paired, image "
      "by image, where both rows kept which images they got right: "
      "\"paired on 2/3 and 3/3 seeds\" where some seeds did not) is "
      "never resolved.",
      "",
      "| claim | paper | verdict |",
      "| --- | --- | --- |",
  ]
  for c in data["claims"]:
    lines.append(f"| {c['claim']} | {c['where']} | {c['verdict']} |")
  if data.get("to_settle"):
    flags = scales_lib.command_flags(data["scale"])
    lines += ["", "## What would settle the open claims", "",
              f"The rows their open comparisons rest on, brought to "
              f"{data['min_seeds']} seeds (`--dry-run --calibrate` first "
              "shows each run's estimated time on the machine it runs "
              "on):", ""]
    for t in data["to_settle"]:
      lines.append(
          f"- `python -m reproduce {t['table']} {flags} "
          f"--rows={','.join(t['rows'])} --seeds={data['min_seeds']}` "
          f"({', '.join(t['claims'])})")
  waiting = {n for t in data.get("to_settle", ()) for n in t["claims"]}
  run_out = [c["name"] for c in data["claims"]
             if c["verdict"].startswith(OPEN) and c["name"] not in waiting]
  if run_out:
    # Without this, a claim left open by differences smaller than the seeds'
    # spread reads as if it only waited for runs the list above lacks.
    lines += ["", "## Open claims with nothing left to run at this scale", "",
              "Each of their unresolved comparisons is within the test "
              "sample's noise (unresolved whatever the seeds) or has "
              f"at least {data['min_seeds']} seeds per row without a resolved "
              f"difference (more than {data['min_seeds']} seeds, or another "
              "scale, could resolve it): "
              + ", ".join(run_out) + "."]
  lines += ["", "## Comparisons run so far", ""]
  if claims_figure.has_comparisons(data):
    lines += [f"![Every comparison run, beside the paper's]({FIGURE})", ""]
  lines += ["| claim | table | the paper's higher row | its lower row | "
            "metric | fkjax: higher - lower | seeds | test-sample noise "
            f"({data['z']:g} SE) | verdict |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for c in data["claims"]:
    for k in c["comparisons"]:
      if k["verdict"] == NOT_RUN:
        continue
      lines.append(
          f"| {c['name']} | {k['table']} | {k['higher']} | {k['lower']} | "
          f"{k['metric']}"
          + (f" vs {k['lower_metric']}" if k.get("lower_metric") else "")
          + f" | {k['higher_mean']:.2f} - {k['lower_mean']:.2f} "
          f"= {k['difference']:+.2f} | {k['seeds'][0]}, {k['seeds'][1]} | "
          f"{_noise_cell(k, data['z'])} | {k['verdict']}"
          f"{_early_note(k)} |")
  return "\n".join(lines) + "\n"


def _early_note(comparison: Mapping[str, Any]) -> str:
  barely = comparison.get("barely_pruned_checkpoints")
  if barely:
    runs = "; ".join(f"{row} {', '.join(seeds)}"
                     for row, seeds in barely.items())
    return f" (evaluated barely pruned: {runs})"
  early = comparison.get("early_checkpoints")
  if not early:
    return ""
  runs = "; ".join(f"{row} {', '.join(seeds)}"
                   for row, seeds in early["runs"].items())
  return (f" (evaluated checkpoint: {runs}; at the last epoch "
          f"{early['difference_at_last_epoch']:+.2f})")


def _noise_cell(comparison: Mapping[str, Any], z: float) -> str:
  if "sample_se" not in comparison:
    return "—"
  kind = "paired" if comparison.get("paired") else "independent"
  seeds = comparison.get("paired_seeds")
  if seeds and any(kept < done for kept, done in seeds):
    # Which seeds the pairing rests on, where some did not keep their images.
    kind += " on " + " and ".join(f"{k}/{n}" for k, n in seeds) + " seeds"
  return f"±{z * comparison['sample_se']:.2f} ({kind})"


def write(results_dir: str, scale: str) -> tuple[str, str]:
  """Writes ``<results_dir>/<scale>/claims.{json,md}`` and, once a
  comparison has run, ``claims.png`` (:mod:`reproduce.report.claims_figure`);
  returns the paths of the first two."""
  data = evaluate(results_dir, scale)
  folder = os.path.join(results_dir, scale)
  os.makedirs(folder, exist_ok=True)
  json_path = os.path.join(folder, "claims.json")
  md_path = os.path.join(folder, "claims.md")
  atomic.write_json(json_path, data)
  atomic.write_text(md_path, markdown(data))
  claims_figure.figure(data, os.path.join(folder, FIGURE))
  return json_path, md_path
