"""Bad numbers on the benchmark command lines: argparse's one line, exit 2."""
import argparse
import importlib
import os
import subprocess
import sys

import pytest

from fkjax import argtypes
from tests.subprocess_env import TIMEOUT_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("parse, text, value", [
    (argtypes.positive_int, "3", 3),
    (argtypes.nonnegative_int, "0", 0),
    (argtypes.positive_seconds, "2.5", 2.5),
    (argtypes.positive_int_list, "1,2,4", [1, 2, 4]),
])
def test_good_values_parse(parse, text, value):
  assert parse(text) == value


@pytest.mark.parametrize("parse, text", [
    (argtypes.positive_int, "0"), (argtypes.positive_int, "-2"),
    (argtypes.positive_int, "1.5"), (argtypes.positive_int, "many"),
    (argtypes.nonnegative_int, "-1"), (argtypes.positive_seconds, "0"),
    (argtypes.positive_seconds, "nan"), (argtypes.positive_seconds, "inf"),
    (argtypes.positive_int_list, "1,0"), (argtypes.positive_int_list, "1,,2"),
    (argtypes.positive_int_list, ""),
])
def test_bad_values_are_refused_with_the_value_named(parse, text):
  with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
    parse(text)


@pytest.mark.parametrize("module, argv, flag", [
    ("benchmarks.bench_train", ["--batch=0"], "--batch"),
    ("benchmarks.bench_train", ["--repeats=-1"], "--repeats"),
    ("benchmarks.bench_sweep", ["--runs=1,0"], "--runs"),
    ("benchmarks.bench_sweep", ["--repeats=0"], "--repeats"),
    ("benchmarks.bench_variants", ["noise", "--batch=-4"], "--batch"),
    ("benchmarks.bench_data", ["--batches=0"], "--batches"),
    ("benchmarks.bench_pgd_loops", ["--steps", "10", "0"], "--steps"),
])
def test_benchmarks_refuse_a_bad_number_before_any_work(module, argv, flag,
                                                        capsys):
  main = importlib.import_module(module).main
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert f"argument {flag}: " in err[-1] and " is not a " in err[-1]


def test_bench_slim_refuses_a_zero_batch_size_in_its_list():
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_slim", "--config=configs/cpu.py",
       "--workdir=/nonexistent", "--latency_batches=1,0"],
      cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
  assert done.returncode != 0
  assert "must be comma-separated positive integers" in done.stderr
  assert "Traceback" not in done.stderr
