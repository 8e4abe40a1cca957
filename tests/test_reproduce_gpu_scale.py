"""The gpu scale: the paper's protocol with a shorter schedule (no training)."""
import math

import pytest

from configs import default as default_config
from reproduce.run import plan as plan_lib
from reproduce.run import runs as runs_lib
from reproduce.spec import scales
from reproduce.spec import tables

GPU = scales.SCALES["gpu"]


def _paper_and_gpu(presets, overrides=None):
  paper = scales.build_config(presets, overrides or {},
                              scales.SCALES["paper"], 0)
  gpu = scales.build_config(presets, overrides or {}, GPU, 0)
  return paper, gpu


def test_only_the_schedule_validation_attack_and_shrinkage_differ():
  paper, gpu = _paper_and_gpu("resnet20,rgsm", {"sparsity.lamb1": 0.1})
  p, g = scales.flat(paper), scales.flat(gpu)
  differ = {k for k in p if p[k] != g[k]}
  assert differ == {
      "training.num_epochs", "training.lr_boundaries",
      "training.weight_decay", "sparsity.lamb1", "sparsity.lamb2",
      "validation.attack_steps", "eval.final_attacks"}
  # the paper's attack, split and test set
  assert (g["attack.num_steps"], g["attack.step_size"],
          g["attack.epsilon"]) == (10, 2 / 255, 8 / 255)
  assert g["dataset.val_size"] == 5000 and g["eval.num_examples"] == 0
  assert g["validation.num_examples"] == 0
  assert g["training.lr_boundaries"] == (16, 24, 32)
  assert g["training.num_epochs"] == scales.GPU_EPOCHS


def test_the_decays_fall_at_the_papers_fractions():
  paper = default_config.get_config()
  fractions = [b / paper.training.num_epochs
               for b in paper.training.lr_boundaries]
  assert fractions == list(scales.PAPER_DECAY_FRACTIONS)
  gpu = scales.build_config("resnet20,none", {}, GPU, 0)
  assert [b / gpu.training.num_epochs
          for b in gpu.training.lr_boundaries] == fractions


@pytest.mark.parametrize("presets, overrides", [
    ("resnet20,none", {}),
    ("en2resnet20,rgsm", {"sparsity.lamb1": 0.05}),
    ("resnet20,rvsm", {"sparsity.beta": 0.01}),
])
def test_summed_decay_is_the_papers(presets, overrides):
  paper, gpu = _paper_and_gpu(presets, overrides)
  m = 5.0
  assert scales.shrinkage_factor(gpu) == pytest.approx(m)
  assert gpu.training.weight_decay == pytest.approx(
      paper.training.weight_decay * m)
  summed = (scales.learning_rate_sum(gpu) * gpu.training.weight_decay)
  assert summed == pytest.approx(
      scales.learning_rate_sum(paper, scales.PAPER_TRAIN_SIZE)
      * paper.training.weight_decay, rel=1e-3)
  if paper.sparsity.method == "rgsm":
    assert gpu.sparsity.lamb2 == pytest.approx(paper.sparsity.lamb2 * m)
    # thresholds sqrt(2 lamb1 / beta) x m^-1/4
    ratio = math.sqrt(gpu.sparsity.lamb1 / paper.sparsity.lamb1)
    assert ratio == pytest.approx(m ** -0.25, rel=1e-3)
  if paper.sparsity.method == "rvsm":
    assert gpu.sparsity.lamb == pytest.approx(paper.sparsity.lamb
                                              * m ** -0.5, rel=1e-3)


def test_rows_have_three_seeds_and_their_extra_evaluations_a_budget():
  runs = plan_lib.plan(tables.TABLE2, GPU, root="w",
                       rows=["resnet20_rgsm_l0.1"])
  assert [r.seed for r in runs] == [0, 1, 2]
  first = {e.protocol: e for e in runs[0].extra_evals}
  assert set(first) == {"a5", "strong"}
  a5 = runs_lib.with_overrides(runs[0].config, first["a5"].overrides)
  assert (a5.eval.attacks, a5.eval.num_examples, a5.eval.nattack_iters,
          a5.eval.nattack_population) == ("nattack", 500, 500, 300)
  strong = runs_lib.with_overrides(runs[0].config, first["strong"].overrides)
  assert strong.eval.strong.targeted and strong.eval.num_examples == 500
  assert not runs[1].extra_evals and not runs[2].extra_evals


def test_the_gpu_and_paper_scales_publish_weights_and_cpu_does_not():
  assert GPU.publish_weights and scales.SCALES["paper"].publish_weights
  assert not scales.SCALES["cpu"].publish_weights
