"""``python -m reproduce <table|all|list> --scale=cpu|gpu|paper|tiny``.

  python -m reproduce list
  python -m reproduce table1 --scale=cpu --dry-run
  python -m reproduce table1 --scale=cpu --rows=resnet20_none --seeds=1
  python -m reproduce all --scale=paper --dry-run
  python -m reproduce table2 --scale=cpu --report-only
  python -m reproduce claims --scale=cpu
  python -m reproduce overview --scale=cpu

Trains and evaluates every run (row x seed) of the table that is not finished,
one after the other, in ``<root>/<scale>/<table>/<row>_seed<k>``, then writes
``<results>/<scale>/<table>.json``, ``.md`` and its figures (also after each
run), and ``<results>/run_names.json`` (the names :mod:`fkjax.pretrained`
loads published runs by). Rerunning the same command skips finished runs
and resumes a killed one from its last checkpoint. ``claims`` judges the
paper's claims from the tables written so far
(``<results>/<scale>/claims.{json,md}``, with ``claims.png``: every
comparison beside the paper's; also rewritten with every table);
``overview`` lists every row run so far in one table
(``<results>/<scale>/overview.md``, with ``overview.png``: the rows against
the paper's numbers; likewise). ``--dry-run`` prints each run's status,
exact ``train.py`` / ``eval.py`` commands and estimated time, and runs
nothing; with ``--calibrate`` it first times ResNet20's
training steps on this machine and estimates for it; with
``--speed-from=benchmarks/results/gpu_latest.json`` it estimates for the
GPU whose training steps ``python -m benchmarks.gpu_bench`` measured there.
``--sweep`` trains the runs that differ only in seeds or hyperparameters (a
row's seeds, Fig. 4's lambda1 values) as one program each (docs/sweeps.md).
``--defer-extra-evals`` finishes each run without its extra evaluations (A5
and the strong protocol, the longest on a CPU): the table reports it
without their columns, and the same command without the flag runs them
alone later.
"""
from __future__ import annotations

# First, before the imports below (seconds): Ctrl-C, or a missing package of
# the [train] extra, during them is one line (fkjax.entry).
from fkjax import entry
if __name__ == "__main__":
  entry.start()
# pylint: disable=wrong-import-position

import argparse
import dataclasses
import os
import sys
import traceback
from typing import Any, Callable

# Every module the runner uses is imported here, at its start, not when the
# first run finishes: a run takes an hour, and a checkout edited meanwhile
# would otherwise mix old modules in memory with new ones from disk.
from absl import logging

from fkjax import cli
from fkjax import kernels
from fkjax import oserrors
from fkjax.data.types import DataError
from reproduce.report import claims
from reproduce.report import figures
from reproduce.report import overview
from reproduce.report import report
from reproduce.run import calibrate
from reproduce.run import estimate as estimate_lib
from reproduce.run import execute as execute_lib
from reproduce.run import measured_speed
from reproduce.run import plan as plan_lib
from reproduce.run import standing as standing_lib
from reproduce.run import sweeps
from reproduce.run import weights
from reproduce.run.estimate import format_seconds
from reproduce.run.progress import log
from reproduce.run.runs import Run
from reproduce.spec import scales as scales_lib
from reproduce.spec import tables as tables_lib


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m reproduce",
      description="Reproduce the paper's tables (docs/reproduction.md).")
  p.add_argument("table", help="a table name, 'all', 'list', 'claims' or "
                      "'overview'")
  p.add_argument("--scale", default="cpu", choices=sorted(scales_lib.SCALES))
  p.add_argument("--dry-run", "--dry_run", action="store_true",
                 help="print the runs, commands and estimates; run nothing")
  p.add_argument("--calibrate", action="store_true",
                 help="with --dry-run: time ResNet20 training steps on this "
                      "machine first (about a minute) and estimate for it "
                      "instead of the reference machine")
  p.add_argument("--speed-from", "--speed_from", default=None,
                 metavar="JSON",
                 help="with --dry-run: estimate from the training steps "
                      "measured in this python -m benchmarks.gpu_bench JSON "
                      "(e.g. benchmarks/results/gpu_latest.json) instead of "
                      "the reference CPU machine")
  p.add_argument("--report-only", "--report_only", action="store_true",
                 help="write the tables from the finished runs; train nothing")
  p.add_argument("--rows", default="",
                 help="comma-separated row names (default: all); with "
                      "'all', each table runs those it has")
  p.add_argument("--seeds", type=int, default=None,
                 help="seeds per row (default: the table's for the scale)")
  p.add_argument("--variant", default=None,
                 choices=sorted(scales_lib.VARIANTS),
                 help="a protocol variant (e.g. authors: the authors' "
                      "released code); results go to <scale>-<variant>")
  p.add_argument("--root", default=plan_lib.DEFAULT_ROOT,
                 help="workdirs go to <root>/<scale>/<table>/<row>_seed<k>")
  p.add_argument("--results", default=plan_lib.DEFAULT_RESULTS,
                 help="tables go to <results>/<scale>/<table>.{json,md}")
  p.add_argument("--no-restore", "--no_restore", action="store_true",
                 help="do not restore finished runs missing from their "
                      "workdirs from <results>/<scale>/runs: they train again "
                      "(and replace what is kept there when they finish)")
  p.add_argument("--defer-extra-evals", "--defer_extra_evals",
                 action="store_true",
                 help="train and evaluate each run (A1-A4, sparsity) but "
                      "leave its extra evaluations (A5 NAttack, the strong "
                      "protocol) for later: the table reports it without "
                      "those columns until the command without this flag "
                      "runs them")
  p.add_argument("--sweep", action="store_true",
                 help="train the runs that differ only in seeds or "
                      "hyperparameters (fkjax.training.sweep.SWEEPABLE_KEYS) as one "
                      "program each (docs/sweeps.md)")
  p.add_argument("--sweep-max-runs", "--sweep_max_runs", type=int,
                 default=None, help="at most this many runs a sweep")
  p.add_argument("--data_dir", "--data-dir", default=None,
                 help="config.dataset.data_dir (default: $FKJAX_DATA_DIR, "
                      "else ~/.cache/fkjax/data)")
  return p


def _list() -> None:
  for table in tables_lib.TABLES.values():
    print(f"{table.name}: {table.paper_ref}: {table.title}")
    for row in table.rows:
      shared = f"  (= {row.shared})" if row.shared else ""
      extra = " ".join(f"{k}={v:g}" for k, v in row.overrides.items()
                       if isinstance(v, float))
      print(f"  {row.name}: {row.presets} {extra}{shared}")


def _write_table(table, scale, runs, results: str) -> dict[str, Any]:
  data = report.collect(table, scale, runs)
  json_path, md_path = report.write(data, results)
  if table.figures and any(r["summary"] for r in data["rows"]):
    folder = os.path.dirname(json_path)
    drawn = []
    for kind in table.figures:
      out = figures.draw(kind, runs, data,
                         os.path.join(folder, f"{table.name}_{kind}.png"))
      if out:
        drawn.append(out)
    if drawn:
      log(f"figures: {', '.join(drawn)}")
  log(f"table written: {md_path}")
  # What fkjax.pretrained resolves a published run's name with (a row that
  # another table trains): rewritten with every table, so it follows them.
  weights.write_names(results)
  for name in _SUMMARIES:
    _write_summary(name, results, scale.name)
  return data


# What the runner rewrites with every table, from the tables on disk:
# name -> writer(results, scale) returning the Markdown file's path.
_SUMMARIES = {"claims": lambda results, scale: claims.write(results, scale)[1],
              "overview": overview.write}


def _write_summary(name: str, results: str, scale: str) -> str:
  path = _SUMMARIES[name](results, scale)
  log(f"{name} written: {path}")
  return path


class _UsageError(ValueError):
  """A command line that names something wrong: one error line, exit 2."""


def _check_flags(args: argparse.Namespace) -> None:
  for flag, value in (("--seeds", args.seeds),
                      ("--sweep-max-runs", args.sweep_max_runs)):
    if value is not None and value < 1:
      raise _UsageError(f"{flag} must be >= 1, got {value}")
  for flag, path in (("--root", args.root), ("--results", args.results)):
    if os.path.exists(path) and not os.path.isdir(path):
      raise _UsageError(f"{flag}={path} is a file, not a folder")
  if args.calibrate and not args.dry_run:
    raise _UsageError("--calibrate goes with --dry-run (it scales the dry "
                      "run's estimates)")
  if args.speed_from and not (args.dry_run and not args.calibrate):
    raise _UsageError("--speed-from goes with --dry-run, without "
                      "--calibrate (each sets the speed it estimates for)")


def _declare_paths(args: argparse.Namespace) -> None:
  """The folders the command writes, checked before anything is trained
  (a row trained for an hour must not fail at writing its table)."""
  writes = not args.dry_run
  oserrors.declare("--root", args.root, write=writes and not args.report_only,
                   folders=(args.scale,))
  oserrors.declare("--results", args.results, write=writes,
                   folders=(args.scale,))
  oserrors.declare("--data-dir", args.data_dir)


def _summary_command(args: argparse.Namespace) -> int:
  """``claims`` or ``overview``: rewrites and prints it from the tables."""
  scale_name = args.scale + (f"-{args.variant}" if args.variant else "")
  if not os.path.isdir(os.path.join(args.results, scale_name)):
    raise _UsageError(
        f"no result tables in {args.results}/{scale_name} yet: run one "
        f"first (python -m reproduce table1 "
        f"{scales_lib.command_flags(scale_name)})")
  with open(_write_summary(args.table, args.results, scale_name)) as f:
    print(f.read(), end="")
  return 0


def _table_names(args: argparse.Namespace) -> list[str]:
  names = list(tables_lib.ORDER) if args.table == "all" else [args.table]
  unknown = [n for n in names if n not in tables_lib.TABLES]
  if unknown:
    raise _UsageError(
        f"unknown table {unknown[0]!r}; one of {sorted(tables_lib.TABLES)}, "
        "'all', 'list', 'claims' or 'overview'")
  return names


def _tables_and_rows(args: argparse.Namespace, names: list[str]
                     ) -> dict[str, list[str]]:
  """The tables the command runs, each with its rows asked for (none: all)."""
  rows = list(dict.fromkeys(r for r in args.rows.split(",") if r))
  if not (rows and args.table == "all"):
    return {n: rows for n in names}
  # Each table runs the rows it has; a name no table has is an error.
  named = {n: set(tables_lib.TABLES[n].row_names) for n in names}
  missing = [r for r in rows if not any(r in named[n] for n in names)]
  if missing:
    raise _UsageError(f"no table has a row {missing[0]!r}; "
                      "python -m reproduce list names them")
  table_rows = {n: [r for r in rows if r in named[n]] for n in names}
  return {n: r for n, r in table_rows.items() if r}


def _scale(args: argparse.Namespace) -> scales_lib.Scale:
  scale = scales_lib.SCALES[args.scale]
  if not args.variant:
    return scale
  try:
    return scales_lib.with_variant(scale, args.variant)
  except ValueError as e:
    raise _UsageError(str(e)) from e


def _plans(args: argparse.Namespace, scale: scales_lib.Scale,
           table_rows: dict[str, list[str]], environment: dict[str, Any]
           ) -> dict[str, list[Run]]:
  try:
    return {name: plan_lib.plan(
        tables_lib.TABLES[name], scale, root=args.root,
        rows=rows or None, seeds=args.seeds, environment=environment,
        results=args.results, restore=not args.no_restore,
        sync=not args.dry_run) for name, rows in table_rows.items()}
  except (KeyError, ValueError) as e:
    # str() of a KeyError is its message in quotes.
    raise _UsageError(e.args[0] if e.args else str(e)) from e


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = _parser().parse_args(argv)
  try:
    _check_flags(args)
    if args.table == "list":
      _list()
      return 0
    if args.table in _SUMMARIES:
      oserrors.declare("--results", args.results, write=True)
      return _summary_command(args)
    names = _table_names(args)
    scale = _scale(args)
    table_rows = _tables_and_rows(args, names)
    environment = ({"dataset.data_dir": args.data_dir} if args.data_dir
                   else {})
    _declare_paths(args)
    if not args.report_only and (args.calibrate or not args.dry_run):
      # As train.py: before planning, which reads the platform (the
      # precision "auto" stands for) and so starts JAX's backend.
      kernels.apply_xla_flags()
    plans = _plans(args, scale, table_rows, environment)
  except _UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.dry_run:
    step_times = None
    if args.speed_from:
      try:
        speed = measured_speed.MeasuredSpeed.load(args.speed_from)
      except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
      return _dry_run(plans, sweep=args.sweep, max_runs=args.sweep_max_runs,
                      speed=speed, extra_evals=not args.defer_extra_evals,
                      from_scratch=_from_scratch(scale, table_rows, None,
                                                 speed))
    if args.calibrate:
      step_times = calibrate.measure()   # with fkjax's CPU flags, as a run
    return _dry_run(plans, sweep=args.sweep, max_runs=args.sweep_max_runs,
                    step_times=step_times,
                    extra_evals=not args.defer_extra_evals,
                    from_scratch=_from_scratch(scale, table_rows,
                                               step_times))
  return _run_tables(args, scale, plans, environment)


def _run_tables(args: argparse.Namespace, scale: scales_lib.Scale,
                plans: dict[str, list[Run]],
                environment: dict[str, Any]) -> int:
  """Runs what is left of each table, rewriting it as runs finish."""
  # --no-restore: the runs asked for train again; the rest of each table
  # is reported as usual.
  not_restored = ({r.workdir for runs in plans.values() for r in runs}
                  if args.no_restore else True)
  if not args.report_only:
    logging.set_verbosity(logging.WARNING)   # orbax logs every file at INFO
  failed = not_started = 0
  for name, runs in plans.items():
    table = tables_lib.TABLES[name]
    # The table always shows all its rows, whatever --rows ran.
    reported = plan_lib.plan_report(table, scale, root=args.root,
                                    seeds=args.seeds,
                                    environment=environment,
                                    results=args.results,
                                    restore=not_restored)
    stale = True   # whether the table on disk lacks what has happened since
    if not args.report_only:
      todo = _todo(name, runs, args.defer_extra_evals)
      log(f"{name} at scale {scale.name}: {len(runs)} runs, "
          f"{len(runs) - len(todo)} done, {len(todo)} to run")
      if args.sweep and todo:
        sweeps.train_in_sweeps(todo, max_runs=args.sweep_max_runs)
      stale, table_failed, table_not_started = _execute(
          name, todo, args.defer_extra_evals,
          lambda: _write_table(table, scale, reported, args.results))
      failed += table_failed
      not_started += table_not_started
    if stale:
      _write_table(table, scale, reported, args.results)
  if failed:
    also = f", {not_started} not started" if not_started else ""
    log(f"{failed} run(s) failed{also}; rerun the same command to "
        "retry them (finished runs are skipped)")
    return 1
  return 0


def _todo(name: str, runs: list[Run], defer_extra_evals: bool
          ) -> list[Run]:
  """The runs of table ``name`` left to run."""
  todo = []
  for r in runs:
    if not standing_lib.finished(r):
      todo.append(r)
      continue
    # Its evaluations not yet run, or made with older defaults.
    left = [] if defer_extra_evals else standing_lib.evals_to_run(r)
    if not left:
      continue
    if not standing_lib.has_checkpoint(r):
      # Restored from results/ without checkpoints: reported as it is.
      log(
          f"{name}/{r.row.name} seed {r.seed}: {', '.join(left)} not yet "
          "run with the settings of now, and its workdir has no checkpoint "
          "to evaluate (restored from results/); to train it again, remove "
          f"{r.workdir} and rerun with --no-restore")
      continue
    todo.append(r)
  return todo


def _execute(name: str, todo: list[Run], defer_extra_evals: bool,
             write_table: Callable[[], Any]) -> tuple[int, int, int]:
  """Runs ``todo`` in turn, rewriting the table after each run that
  finishes; returns whether the table on disk lacks the last run's outcome
  (a failure, or no run at all), and how many runs failed and were not
  started."""
  stale = True
  failed = 0
  for i, run in enumerate(todo, 1):
    log(f"[{name} {i}/{len(todo)}] {run.row.name} seed "
        f"{run.seed} ({standing_lib.status_of(run)})")
    try:
      record = execute_lib.execute(run, extra_evals=not defer_extra_evals)
    except Exception as e:  # pylint: disable=broad-except
      # One failed run (a diverged training, say) must not stop the
      # table: it is reported as failed and rerun next time.
      failed += 1
      execute_lib.record_failure(run, e)
      line = cli.error_line(e)
      log(f"[{name} {i}/{len(todo)}] {run.row.name} seed "
          f"{run.seed} FAILED: {type(e).__name__}: "
          f"{line or cli.one_line(e)}")
      # A user's mistake (missing data, a workdir in use, a full disk) is
      # said in that one line; a bug also shows where it happened.
      if line is None:
        traceback.print_exc()
      if isinstance(e, DataError) and i < len(todo):
        # Every run of a table reads the same data: all would fail so.
        log(f"{name}: its {len(todo) - i} other run(s) to "
            "run read the same data: not started")
        return True, failed, len(todo) - i
      stale = True
      continue
    metrics = ", ".join(f"{k} {v:.2f}" for k, v in record["metrics"].items()
                        if k in tables_lib.TABLES[name].metrics)
    log(
        f"[{name} {i}/{len(todo)}] {run.row.name} seed {run.seed} done "
        f"in {format_seconds(record['wall_seconds'])}: {metrics}")
    write_table()
    stale = False
  return stale, failed, 0


def _from_scratch(scale: scales_lib.Scale,
                  table_rows: dict[str, list[str]],
                  step_times: estimate_lib.StepTimes | None,
                  speed: measured_speed.MeasuredSpeed | None = None
                  ) -> dict[str, tuple[float, float]]:
  """Per table, its estimated time if nothing had run: with 1 seed a row,
  and with the table's seeds (docs/reproduction.md's figures); on the GPU
  of ``speed`` if given."""
  step_times = step_times or estimate_lib.REFERENCE_STEP_TIMES
  times_of = (lambda run: speed.step_times(run.config)) if speed else None
  one, every = (estimate_lib.from_scratch_seconds(
      table_rows, scale, seeds=seeds, step_times=step_times,
      step_times_of=times_of) for seeds in (1, None))
  return {name: (one[name], every[name]) for name in table_rows}


def _dry_run(plans: dict[str, list[Run]], sweep: bool = False,
             max_runs: int | None = None,
             step_times: estimate_lib.StepTimes | None = None,
             extra_evals: bool = True,
             from_scratch: dict[str, tuple[float, float]] | None = None,
             speed: measured_speed.MeasuredSpeed | None = None) -> int:
  """Prints every run's status, commands and estimate: for the reference
  CPU machine, this one's ``step_times``, or a GPU's measured ``speed``
  (``from_scratch``: each table's time as if nothing had run)."""
  where = "on 2 idle CPU cores"
  if step_times is not None:
    where = "on this machine"
    _print_step_times(step_times)
  step_times = step_times or estimate_lib.REFERENCE_STEP_TIMES
  times_of = lambda run: step_times
  if speed is not None:
    where = f"on the measured {speed.environment.get('device_kind', 'GPU')}"
    print(f"# estimates from the training steps of {speed.describe()}, "
          "scaled by each run's model, steps, epochs and evaluations\n")
    times_of = lambda run: speed.step_times(run.config)
  total = 0.0
  seen = set()
  for name, runs in plans.items():
    print(f"# {name}: {tables_lib.TABLES[name].title}")
    if sweep:
      for group in sweeps.sweep_groups(runs, max_runs):
        if len(group) > 1:
          print(f"- sweep of {len(group)} runs as one program: "
                + ", ".join(r.key for r in group))
    table_total = 0.0
    for run in runs:
      status, estimate = _status_and_estimate(run, times_of(run),
                                              extra_evals)
      new = run.key not in seen and status != "done"
      seen.add(run.key)
      if new:
        table_total += estimate
      shared = (f" (shared: {run.owner_table}/{run.owner_row.name})"
                if run.row.shared else "")
      print(f"- {run.row.name} seed {run.seed}{shared}: {status}, "
            f"~{format_seconds(estimate)} {where}")
      print(f"    {run.train_command}")
      print(f"    {run.eval_command}")
      for e in run.extra_evals:
        print(f"    {e.command}")
    scratch = ""
    if from_scratch:
      one, every = from_scratch[name]
      scratch = (f"; from scratch ~{format_seconds(one)} with 1 "
                 f"seed a row, ~{format_seconds(every)} with the "
                 "table's seeds")
    print(f"# {name}: ~{format_seconds(table_total)} left to run"
          f"{scratch} (runs not shared with a table listed before it)\n")
    total += table_total
  if len(plans) > 1:
    scratch = ""
    if from_scratch:
      one, every = (sum(t[i] for t in from_scratch.values()) for i in (0, 1))
      scratch = (f" (from scratch ~{format_seconds(one)} with 1 "
                 f"seed a row, ~{format_seconds(every)} with the "
                 "tables' seeds)")
    print(f"# total: ~{format_seconds(total)} {where}{scratch}")
  return 0


def _print_step_times(step_times: estimate_lib.StepTimes) -> None:
  reference = estimate_lib.REFERENCE_STEP_TIMES
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
  print(f"# this machine's ResNet20 steps at batch 128: "
        f"{step_times.clean_step:.3f} s clean, "
        f"+{step_times.attack_iteration:.3f} s per attack iteration "
        f"(the reference machine, 2 idle CPU cores: "
        f"{reference.clean_step:.3f} s, +{reference.attack_iteration:.3f} "
        "s); the estimates below are scaled to them"
        + (f" (load average {load:.1f} while timing: on an idle machine "
           "they would be shorter)" if load > 0.5 else "") + "\n")


def _status_and_estimate(run: Run,
                         step_times: estimate_lib.StepTimes,
                         extra_evals: bool) -> tuple[str, float]:
  """Where ``run`` stands, and the seconds left to run it."""
  # A finished run kept under results/ but not in its workdir is read
  # there: a dry run copies nothing.
  view = standing_lib.status_view(run)
  status = standing_lib.status_of(view)
  if not standing_lib.finished(view):
    return status, estimate_lib.estimate_seconds(
        run if extra_evals else dataclasses.replace(run, extra_evals=[]),
        epochs_done=standing_lib.trained_epochs(run) or 0,
        step_times=step_times)
  if not extra_evals:
    return ("done" if status == "done" else f"{status} (deferred)"), 0.0
  left = standing_lib.evals_to_run(view)
  if standing_lib.has_checkpoint(run):
    return status, estimate_lib.estimate_seconds(
        run, only=[e for e in run.extra_evals
                   if f"eval_{e.protocol}" in left],
        main_eval="eval" in left, step_times=step_times)
  if standing_lib.pending_evals(view):
    status += " (no checkpoint here: reported without it)"
  elif left:
    status += " (no checkpoint here: reported as it ran)"
  return status, 0.0


INTERRUPTED = ("interrupted; rerun the same command to go on (finished runs "
               "and evaluations are kept, a run resumes from its last "
               "checkpoint)")


def _run_cli() -> int:
  """``main`` for the shell: a wrong environment variable, a user's
  mistake or a path that cannot be written ends in one line
  (:func:`fkjax.cli.guard`); Ctrl-C at any moment in one line and 130, as
  it does train.py and eval.py; a reader that stops early (``| head``)
  ends it quietly, as it does ``ls`` or ``grep``, not with a BrokenPipeError
  traceback."""
  try:
    cli.check_environment()
    code = cli.guard(main, interrupted=INTERRUPTED)
    sys.stdout.flush()
    return code
  except SystemExit as e:
    return cli.exit_code(e)
  except BrokenPipeError:
    # Python's recipe (docs of signal, "Note on SIGPIPE"): point stdout at
    # devnull so that the flush at exit does not raise again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


if __name__ == "__main__":
  cli.exit(_run_cli())
