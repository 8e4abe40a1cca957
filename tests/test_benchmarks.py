"""Tests of the benchmark helpers; the PyTorch cross-check needs torch."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import bench_train
from configs import default as default_config
from fkjax.training import build


def test_forward_macs_matches_a_direct_count():
  # ResNet8 (n=1) counted layer by layer: stem, stage1, stage2, stage3, head.
  expected = (32 * 32 * 3 * 16 * 9
              + 2 * 32 * 32 * 16 * 16 * 9
              + 16 * 16 * 16 * 32 * (9 + 1) + 16 * 16 * 32 * 32 * 9
              + 8 * 8 * 32 * 64 * (9 + 1) + 8 * 8 * 64 * 64 * 9
              + 64 * 10)
  assert bench_train.forward_macs(8) == expected
  # Each extra block per stage adds two full-width 3x3 convs per stage.
  per_block = 2 * 9 * (32 * 32 * 16 * 16 + 16 * 16 * 32 * 32 + 8 * 8 * 64 * 64)
  assert bench_train.forward_macs(14) - bench_train.forward_macs(8) == per_block


def test_forward_equivalents_and_gflops():
  assert bench_train.forward_equivalents("clean", 10, 20) == 3
  assert bench_train.forward_equivalents("pgd", 10, 20) == 24
  assert bench_train.forward_equivalents("pgd", 10, 20, False) == 23
  assert bench_train.forward_equivalents("ifgsm", 10, 20) == 41
  with pytest.raises(ValueError):
    bench_train.forward_equivalents("nope", 1, 1)
  assert bench_train.gflops(10**9, 2, 3.0, 4, 2.0) == pytest.approx(24.0)


def test_interleaved_alternates_and_counts():
  calls = []
  times = bench_train.interleaved(
      {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
      repeats=3, warmup=1)
  assert calls == ["a", "b"] + ["a", "b"] * 3
  assert [len(v) for v in times.values()] == [3, 3]


def test_markdown_has_one_row_per_result():
  row = {"model": "resnet20", "bench": "pgd", "batch": 8, "fkjax_ms": 10.0,
         "fkjax_min_ms": 9.0, "torch_ms": 20.0, "torch_min_ms": 18.0,
         "fkjax_gflops": 5.0, "torch_gflops": 2.5, "fkjax_compile_s": 1.0,
         "fkjax_memory_mb": 3.0, "load_before": (1.0, 1.0, 1.0),
         "load_after": (2.0, 2.0, 2.0)}
  table = bench_train.format_markdown([row, {**row, "bench": "clean"}], 50.0)
  lines = [l for l in table.splitlines() if l.startswith("| resnet20")]
  assert len(lines) == 2
  assert "0.50 (0.50)" in lines[0] and "10%" in lines[0]


def test_timing_fields_has_images_per_second():
  fields = bench_train.timing_fields("torch", [0.1, 0.2, 0.4], 8, 10**9, 1,
                                     3.0)
  assert fields["torch_ms"] == pytest.approx(200.0)
  assert fields["torch_min_ms"] == pytest.approx(100.0)
  assert fields["torch_images_per_s"] == pytest.approx(40.0)
  assert fields["torch_gflops"] == pytest.approx(2 * 3 * 8 / 0.2)


def test_markdown_names_devices_peak_and_images_per_second():
  row = {"model": "resnet20", "bench": "clean", "batch": 8, "fkjax_ms": 10.0,
         "fkjax_min_ms": 9.0, "fkjax_images_per_s": 800.0,
         "fkjax_gflops": 5.0, "load_before": (1.0, 1.0, 1.0),
         "load_after": (2.0, 2.0, 2.0)}
  table = bench_train.format_markdown(
      [row], 4e5, "jnp.dot 8192^2 at JAX's default precision = TF32",
      {"fkjax": "gpu (NVIDIA H100 80GB HBM3)", "torch": "cuda"})
  lines = table.splitlines()
  assert "TF32" in lines[0] and "400000.0 GFLOP/s" in lines[0]
  assert "fkjax on gpu (NVIDIA H100 80GB HBM3), torch on cuda" in lines
  header = next(l for l in lines if l.startswith("| model"))
  assert "fkjax images/s | torch images/s" in header
  cells = [c.strip() for c in lines[-1].strip("|").split("|")]
  assert len(cells) == len(header.strip("|").split("|"))
  assert cells[6:8] == ["800.0", "-"]  # no torch run: a dash


def test_jax_matmul_tflops_runs_on_any_backend():
  # The GPU peak's code path, on a tiny matrix on whatever JAX has here.
  tflops = bench_train.jax_matmul_tflops(
      n=64, repeats=2, precision=jax.lax.Precision.HIGHEST)
  assert tflops > 0


def test_device_auto_is_cpu_without_cuda(monkeypatch):
  torch = pytest.importorskip("torch")
  monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
  assert bench_train.resolve_device("auto") == "cpu"
  assert bench_train.resolve_device("cpu") == "cpu"
  with pytest.raises(ValueError):
    bench_train.resolve_device("cuda")
  monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
  assert bench_train.resolve_device("auto") == "cuda"


def test_torch_runner_on_cpu():
  pytest.importorskip("torch")
  config = bench_train.fkjax_config("resnet20", "clean", 2, 1, 1, None)
  config.model.depth = 8  # keep it cheap
  run, info = bench_train.torch_runner(config, "clean", 2, "cpu")
  assert set(run()) == {"loss"}
  assert info["num_params"] > 0


def _torch_devices():
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    return ["cpu"]
  return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _torch_devices())
@pytest.mark.parametrize("ensemble_size", [1, 2])
@pytest.mark.parametrize("normalize", [None, True])
def test_torch_reference_computes_the_configured_model(ensemble_size, device,
                                                       normalize):
  # normalize None: configs/default.py's own setting (False: [0, 1] inputs
  # unnormalised), the one every benchmark times.
  torch = pytest.importorskip("torch")
  from benchmarks import torch_reference as ref
  config = default_config.get_config()
  assert config.model.normalize is False  # what the default case checks
  if normalize is not None:
    config.model.normalize = normalize
  config.model.depth = 8
  config.model.ensemble_size = ensemble_size
  # Noise draws cannot agree across frameworks: compare the noiseless net.
  config.model.noise_coef = 0.0
  config.kernels.conv, config.kernels.noise = "xla", "jnp"
  model = build.create_model(config, 10)
  x = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
  variables = model.init({"params": jax.random.key(0)}, jnp.asarray(x))
  # Non-trivial BatchNorm statistics, so that eval mode is really checked.
  stats = jax.tree.map(lambda s: s + 0.1, variables["batch_stats"])
  want = model.apply({**variables, "batch_stats": stats}, jnp.asarray(x))
  net = ref.create_model_from_config(config.model, device=device)
  ref.load_flax_variables(net, variables["params"], stats)
  assert ref.num_params(net) == sum(
      p.size for p in jax.tree.leaves(variables["params"]))
  net.eval()
  with torch.no_grad():
    images = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)
    got = net(images).cpu().numpy()
  # TF32 convolutions on a GPU (JAX's and cuDNN's default) round more.
  on_gpu = device != "cpu" or jax.default_backend() == "gpu"
  tol = 1e-2 if on_gpu else 1e-4
  np.testing.assert_allclose(got, np.asarray(want), rtol=tol, atol=tol)


def test_torch_reference_refuses_a_model_it_does_not_implement():
  pytest.importorskip("torch")
  from benchmarks import torch_reference as ref
  config = default_config.get_config()
  config.model.width = 2
  with pytest.raises(ValueError, match="width"):
    ref.create_model_from_config(config.model)


def test_experiment_winograd_conv_is_a_convolution():
  from benchmarks.experiments import conv_layers  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((2, 8, 6, 3), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((3, 3, 3, 4), dtype=np.float32))
  want = jax.lax.conv_general_dilated(
      x, w, (1, 1), [(1, 1), (1, 1)],
      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  np.testing.assert_allclose(conv_layers.winograd_conv(x, w), want,
                             rtol=1e-4, atol=1e-4)


def test_experiment_hash_once_noise_is_standard_normal():
  from benchmarks.experiments import noise_draws  # pylint: disable=import-outside-toplevel
  z = np.asarray(noise_draws.normal_hash_once(jax.random.key(3), 200_001))
  assert z.shape == (200_001,)
  assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
  # the two words of a hash are different draws, not copies
  assert abs(np.corrcoef(z[0:-1:2], z[1::2])[0, 1]) < 0.01


def _frameworks() -> str:
  try:
    import torch  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return "fkjax"   # the PyTorch side is skipped where torch is absent
  return "fkjax,torch"


def test_bench_train_runs_its_benches_for_zero_repeats(tmp_path):
  # docs/performance.md's commands, cut to a ResNet8, batch 2, one step and
  # no timed run: every code path of both sides, compile time and memory.
  # The fkjax side's train benches share one code path (pgd and pgd_bneval
  # only change the config of "clean"), so it runs clean and ifgsm; the
  # cheap PyTorch side runs all four.
  common = ["--models", "resnet8", "--repeats", "0", "--batch", "2",
            "--eval-batch", "2", "--steps", "1", "--eval-steps", "1",
            "--peak-size", "64", "--device", "cpu"]
  out = tmp_path / "bench.json"
  bench_train.main(common + ["--benches", "clean,ifgsm", "--warmup", "0",
                             "--frameworks", "fkjax", "--json", str(out)])
  rows = json.loads(out.read_text())["rows"]
  assert [r["bench"] for r in rows] == ["clean", "ifgsm"]
  for row in rows:
    assert row["fkjax_compile_s"] > 0 and row["fkjax_num_params"] > 0
    assert row["fkjax_memory_mb"] is None or row["fkjax_memory_mb"] > 0
  if "torch" not in _frameworks():
    pytest.skip("torch is not installed: the PyTorch side was not run")
  bench_train.main(common + ["--benches", ",".join(bench_train.BENCHES),
                             "--frameworks", "torch", "--json", str(out)])
  torch_rows = json.loads(out.read_text())["rows"]
  assert [r["bench"] for r in torch_rows] == list(bench_train.BENCHES)
  # Both sides build the same ResNet8.
  assert {r["torch_num_params"] for r in torch_rows} == {
      rows[0]["fkjax_num_params"]}


def test_cross_check_compares_image_by_image():
  from benchmarks import cross_check  # pylint: disable=import-outside-toplevel
  fk = np.array([1, 1, 0, 0, 1], bool)
  th = np.array([1, 0, 1, 0, 0], bool)
  assert cross_check.compare(fk, th) == {
      "fkjax": 60.0, "torchattacks": 40.0, "robust_fkjax_only": 2,
      "robust_torchattacks_only": 1, "images": 5}


def test_cross_check_attacks_the_same_model_on_both_sides():
  pytest.importorskip("torchattacks")
  from benchmarks import cross_check  # pylint: disable=import-outside-toplevel
  from benchmarks import torch_reference as ref  # pylint: disable=import-outside-toplevel
  config = default_config.get_config("resnet8")
  config.kernels.conv, config.kernels.noise = "xla", "jnp"
  model = build.create_model(config, 10)
  apply_fn, _ = build.model_fns(model)
  images = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
  variables = model.init({"params": jax.random.key(0)}, jnp.asarray(images))
  variables = {"params": variables["params"],
               "batch_stats": variables["batch_stats"]}
  labels = np.asarray(jnp.argmax(apply_fn(variables, jnp.asarray(images),
                                          jax.random.key(1)), -1))
  labels = labels.astype(np.int32)
  net = ref.create_model_from_config(config.model)
  ref.load_flax_variables(net, variables["params"], variables["batch_stats"])
  net.eval()
  options = dict(epsilon=0.0, iters=2, restarts=1, eot=1, batch=4, seed=0)
  # epsilon 0: no attack can move an image, so both keep all 4 right.
  fk = cross_check.fkjax_robust(apply_fn, variables, images, labels,
                                "apgd_ce", **options)
  th = cross_check.torch_robust(net, images, labels, "apgd_ce", **options)
  assert fk.tolist() == th.tolist() == [True] * 4


def test_bench_strong_times_each_attack_of_the_strong_protocol(tmp_path):
  from benchmarks import bench_strong  # pylint: disable=import-outside-toplevel
  rows = bench_strong.main(["--models", "resnet8", "--images", "2",
                            "--iters", "1", "--repeats", "1"])
  assert [r["attack"] for r in rows] == ["apgd_ce", "apgd_dlr", "apgd_t"]
  assert all(r["seconds"] > 0 and r["compile_s"] > 0 for r in rows)
  table = bench_strong.format_markdown(rows)
  assert "| resnet8 | APGD-T | 2 | 1 | 1 | 0 |" in table


@pytest.mark.slow
def test_bench_strong_sets_the_misclassified_images_aside():
  from benchmarks import bench_strong  # pylint: disable=import-outside-toplevel
  rows = bench_strong.main(["--models", "resnet8", "--images", "4",
                            "--iters", "1", "--misclassified", "0.5",
                            "--active-set", "--epsilon", "0"])
  runs = {r["label"]: r["image_runs"] for r in rows}
  # Two of four images misclassified clean: each run attacks the other two
  # (epsilon 0 breaks none of them), unless told to attack every image.
  assert runs == {"apgd_ce": 2, "apgd_dlr": 2, "apgd_t": 2 * 9,
                  "apgd_ce every image": 4, "apgd_t every image": 4 * 9}
  with pytest.raises(SystemExit):
    bench_strong.main(["--misclassified", "1.5"])


def test_bench_data_and_bench_variants_run_once(capsys):
  # The other fkjax-only benchmarks, cut to one batch / one repeat of a
  # ResNet8 (bench_sweep, bench_variants cache, bench_slim and
  # benchmarks/experiments are not run here: minutes each on 2 cores).
  from benchmarks import bench_data  # pylint: disable=import-outside-toplevel
  from benchmarks import bench_variants  # pylint: disable=import-outside-toplevel
  bench_data.main(["--batches", "1", "--batch_size", "8"])
  assert "eval_batches" in capsys.readouterr().out
  bench_variants.main(["noise", "--model", "resnet8", "--batch", "2",
                       "--repeats", "1"])
  result = json.loads(capsys.readouterr().out.splitlines()[-1])["result"]
  assert set(result) == {"no noise", *bench_variants.PRNG_IMPLS}


def test_peak_memory_reads_an_evaluation_s_compiled_attack():
  # It once read Evaluator's private cache and broke when its shape
  # changed; one clean-accuracy batch of 4 images of a ResNet8 in-process.
  from benchmarks.experiments import peak_memory  # pylint: disable=import-outside-toplevel
  row = peak_memory._measure("resnet8", "natural", 1, 4)  # pylint: disable=protected-access
  assert row["workload"] == "natural" and row["batch"] == 4
  assert row["peak_rss_gb"] > 0


_HLO_WITH_A_LOOP = """\
HloModule jit_step, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%body (p: (s32[], f32[4], /*index=2*/f32[16])) -> (s32[], f32[4], f32[16]) {
  %ar.1 = (f32[16]{0}, f32[16]{0}) all-reduce(%x, %y), channel_id=1, to_apply=%add
  %ar.2 = f32[4]{0} all-reduce(%z), channel_id=2, to_apply=%add
  ROOT %t = (s32[], f32[4], f32[16]) tuple(%i, %ar.2, %w)
}

%cond (p: (s32[], f32[4], /*index=2*/f32[16])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (param.1: f32[4], /*index=1*/param.2: f32[16]) -> f32[4] {
  %ar.0 = f32[262144]{0} all-reduce(%g), channel_id=3, to_apply=%add
  %loop = (s32[], f32[4], f32[16]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  ROOT %out = f32[4]{0} get-tuple-element(%loop), index=1
}
"""


def test_the_collectives_count_counts_a_loops_all_reduces_per_trip():
  from benchmarks.experiments import collectives  # pylint: disable=import-outside-toplevel
  # 1 outside the loop, 2 in its body run 10 times
  assert collectives.all_reduces_per_run(_HLO_WITH_A_LOOP) == (3, 21)
  assert collectives.all_reduce_bytes(_HLO_WITH_A_LOOP) == [128, 16,
                                                            1048576]
