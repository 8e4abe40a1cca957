"""A killed evaluation resumes at its next batch (fkjax.evaluation.journal)."""
import functools
import json
import os

import jax
import numpy as np
import pytest

from fkjax import attacks
from fkjax.evaluation import journal as eval_journal
from fkjax import evaluation
from fkjax import workdir as workdir_lib
from tests import tiny_models
from tests.killed import Killed, killed_after


_noisy_mlp = tiny_models.noisy_relu_mlp


@pytest.fixture(scope="module")
def mlp():
  params, images, labels = tiny_models.trained_mlp()
  batches = [{"image": images[i:i + 4], "label": labels[i:i + 4]}
             for i in range(0, 12, 4)]
  return params, batches


def _attacked_batches(seen):
  """FGSM that records, on the host, each batch it attacks."""
  def attack(apply_fn, variables, images, labels, key):
    jax.debug.callback(lambda: seen.append(1))
    return attacks.fgsm(apply_fn, variables, images, labels, key,
                        epsilon=0.1, eot_samples=2)
  return attack


def _journal(tmp_path, **identity):
  return eval_journal.Journal(str(tmp_path / "j" / "eval_paper.json"),
                              {"step": 7, **identity})


def test_a_killed_evaluation_resumes_to_the_uninterrupted_result(
    mlp, tmp_path):
  params, batches = mlp
  seen = []
  evaluator = evaluation.Evaluator(_noisy_mlp, {
      "natural": evaluation.natural, "fgsm": _attacked_batches(seen)})
  key = jax.random.key(4)
  whole = evaluator(params, batches, key, per_image=True)
  assert len(seen) == 3
  journal = _journal(tmp_path)
  seen.clear()
  with pytest.raises(Killed):
    evaluator(params, killed_after(batches, 2), key, per_image=True,
              journal=journal)
  assert len(seen) == 2 and journal.batches_done() == 2
  seen.clear()
  resumed = evaluator(params, batches, key, per_image=True, journal=journal)
  assert len(seen) == 1   # only the batch the kill left
  assert resumed.num_examples == whole.num_examples == 12
  for name in ("natural", "fgsm"):
    assert resumed.attacks[name].correct == whole.attacks[name].correct
    np.testing.assert_array_equal(resumed.per_image[name],
                                  whole.per_image[name])
  assert resumed.accuracy("fgsm") < resumed.accuracy("natural")


def _set_seconds(journal, seconds, compile_seconds):
  """The journal, as if its attempt had spent these seconds."""
  state = json.loads(open(journal.path).read())
  state["seconds"] = {name: seconds for name in state["seconds"]}
  state["compile_seconds"] = {name: compile_seconds
                              for name in state["compile_seconds"]}
  open(journal.path, "w").write(json.dumps(state))


def test_a_resumed_evaluation_counts_the_earlier_attempts_seconds(
    mlp, tmp_path):
  params, batches = mlp
  evaluator = evaluation.Evaluator(_noisy_mlp, {
      "natural": evaluation.natural, "fgsm": _attacked_batches([])})
  key = jax.random.key(4)
  journal = _journal(tmp_path)
  with pytest.raises(Killed):
    evaluator(params, killed_after(batches, 2), key, journal=journal)
  _set_seconds(journal, 1000.0, 400.0)
  resumed = evaluator(params, batches, key, journal=journal)
  assert resumed.resumed_seconds == 2000.0
  for entry in resumed.attacks.values():
    assert entry.seconds > 1000.0 and entry.compile_seconds >= 400.0
  fresh = evaluator(params, batches, key, journal=_journal(tmp_path, new=1))
  assert fresh.resumed_seconds == 0.0
  # The strong protocol's wall time adds its seeds' earlier attempts.
  run = functools.partial(
      evaluation.strong_evaluation, _noisy_mlp, params, batches[:2],
      jax.random.key(2), epsilon=0.1, num_iters=1, num_seeds=1,
      journal=journal.scoped("strong"))
  first = run()
  _set_seconds(journal.scoped("strong").scoped("seed0"), 500.0, 0.0)
  again = run()
  assert first.seconds < 500.0 < again.seconds


def test_a_journal_of_another_evaluation_is_not_used(mlp, tmp_path):
  params, batches = mlp
  seen = []
  evaluator = evaluation.Evaluator(_noisy_mlp, {
      "fgsm": _attacked_batches(seen)})
  journal = _journal(tmp_path)
  with pytest.raises(Killed):
    evaluator(params, killed_after(batches, 2), jax.random.key(4),
              journal=journal)
  seen.clear()
  # Another key (another seed), or another checkpoint: all three batches.
  evaluator(params, batches, jax.random.key(5), journal=journal)
  assert len(seen) == 3
  seen.clear()
  evaluator(params, batches, jax.random.key(5),
            journal=_journal(tmp_path, checkpoint="latest"))
  assert len(seen) == 3
  # Each identity has its own file: the other checkpoint's replaced none.
  assert _journal(tmp_path).batches_done() == 3
  assert _journal(tmp_path, checkpoint="latest").batches_done() == 3
  assert len(list((tmp_path / "j").iterdir())) == 2
  # A cut file (a disk full mid-write elsewhere) reads as none.
  path = tmp_path / "j" / os.path.basename(journal.path)
  path.write_text(path.read_text()[:40])
  seen.clear()
  evaluator(params, batches, jax.random.key(5), journal=journal)
  assert len(seen) == 3


def test_each_seed_of_the_strong_protocol_resumes_on_its_own(mlp, tmp_path):
  params, batches = mlp
  seen = []
  evaluator = evaluation.Evaluator(_noisy_mlp, {
      "natural": evaluation.natural, "fgsm": _attacked_batches(seen)})
  key = jax.random.key(9)
  whole = evaluation.repeat_evaluation(evaluator, params, batches, key,
                                     num_seeds=2)
  journal = _journal(tmp_path)

  def cut_in_seed_two():
    # Seed 1 reads all batches, seed 2 is killed after its first.
    cut_in_seed_two.calls += 1
    return (batches if cut_in_seed_two.calls == 1
            else killed_after(batches, 1))
  cut_in_seed_two.calls = 0
  with pytest.raises(Killed):
    evaluation.repeat_evaluation(evaluator, params, cut_in_seed_two, key,
                               num_seeds=2, journal=journal)
  assert journal.scoped("seed0").batches_done() == 3
  assert journal.scoped("seed1").batches_done() == 1
  seen.clear()
  resumed = evaluation.repeat_evaluation(evaluator, params, batches, key,
                                       num_seeds=2, journal=journal)
  assert len(seen) == 2
  assert resumed.attacks["fgsm"].accuracy.per_seed == (
      whole.attacks["fgsm"].accuracy.per_seed)
  assert resumed.worst_case == whole.worst_case


@pytest.mark.slow
def test_the_strong_protocols_sanity_checks_keep_their_batches(mlp, tmp_path):
  params, batches = mlp
  journal = _journal(tmp_path)
  run = functools.partial(
      evaluation.strong_evaluation, _noisy_mlp, params, batches[:1],
      jax.random.key(2), epsilon=0.1, num_iters=1, num_seeds=1,
      sanity_batches=batches[1:],
      # 0: the clean images, no APGD to compile for the sweep's first radius.
      sanity_options={"sweep_epsilons": (0.0, 0.1), "sweep_steps": 1,
                      "steps": (1, 2), "nattack_population": 2,
                      "nattack_iters": 1},
      journal=journal)
  first = run()
  assert journal.scoped("seed0").batches_done() == 1
  assert journal.scoped("sanity").batches_done() == 2
  # Run again, the sanity checks' batches are read from their journal, not
  # attacked: a journal saying every attack left every image right shows.
  path = journal.scoped("sanity").path
  state = json.loads(open(path).read())
  n = state["num_examples"]
  state["correct"] = {name: n for name in state["correct"]}
  state["per_image"] = {name: workdir_lib.encode_correct(np.ones(n, bool))
                        for name in state["per_image"]}
  open(path, "w").write(json.dumps(state))
  again = run()
  assert first.sanity != again.sanity
  assert all(v == 100.0 for v in again.sanity["accuracies"].values())
  assert again.worst_case == first.worst_case


def test_a_kill_within_a_batch_keeps_the_attacks_it_finished(mlp, tmp_path):
  params, batches = mlp
  seen, armed = [], [True]

  def last(apply_fn, variables, images, labels, key):
    """The identity, killed (on the host) while ``armed``."""
    def check():
      if armed:
        raise Killed()
    jax.debug.callback(check)
    return evaluation.natural(apply_fn, variables, images, labels, key)

  evaluator = evaluation.Evaluator(_noisy_mlp, {
      "natural": evaluation.natural, "fgsm": _attacked_batches(seen),
      "last": last})
  key = jax.random.key(5)
  journal = _journal(tmp_path)
  with pytest.raises(Exception):   # the kill, through XLA's runtime
    evaluator(params, batches, key, per_image=True, journal=journal)
  assert len(seen) == 1 and journal.batches_done() == 0
  armed.clear()
  seen.clear()
  resumed = evaluator(params, batches, key, per_image=True, journal=journal)
  assert len(seen) == 2   # FGSM's first batch was kept, not attacked again
  seen.clear()
  whole = evaluator(params, batches, key, per_image=True)
  assert len(seen) == 3
  assert resumed.num_examples == whole.num_examples == 12
  for name in ("natural", "fgsm", "last"):
    assert resumed.attacks[name].correct == whole.attacks[name].correct
    np.testing.assert_array_equal(resumed.per_image[name],
                                  whole.per_image[name])


def test_a_killed_evaluation_under_other_settings_keeps_its_batches(
    mlp, tmp_path):
  params, batches = mlp
  seen = []
  evaluator = evaluation.Evaluator(_noisy_mlp, {
      "fgsm": _attacked_batches(seen)})
  key = jax.random.key(4)
  with pytest.raises(Killed):
    evaluator(params, killed_after(batches, 2), key,
              journal=_journal(tmp_path, batch_size=4))
  # Another batch size runs (and is killed) in between...
  with pytest.raises(Killed):
    evaluator(params, killed_after(batches, 1), key,
              journal=_journal(tmp_path, batch_size=8))
  # ...and the first, run again, resumes at its third batch.
  seen.clear()
  evaluator(params, batches, key, journal=_journal(tmp_path, batch_size=4))
  assert len(seen) == 1
