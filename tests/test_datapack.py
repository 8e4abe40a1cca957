"""CIFAR-10's crossing to a lent GPU: the image codec and the parts."""
import json
import os
import subprocess

import numpy as np
import pytest

from reproduce import datapack
from reproduce import imagecodec


def _smooth_images(n, seed=0):
  """Images with CIFAR's local structure: smooth gradients, edges, and
  colour planes that move together, plus a little noise."""
  rng = np.random.default_rng(seed)
  yy, xx = np.mgrid[0:32, 0:32]
  out = np.empty((n, 3, 32, 32), np.uint8)
  for i in range(n):
    # texture: noise on a 4x4 grid, upsampled; shared by the three planes
    texture = np.kron(rng.normal(0, 12, (8, 8)), np.ones((4, 4)))
    base = (rng.uniform(0, 3) * xx + rng.uniform(0, 3) * yy + texture
            + 60 * (xx > rng.integers(4, 28)) - 50 * (yy > rng.integers(4, 28)))
    for c in range(3):
      plane = base * rng.uniform(0.5, 1.0) + rng.uniform(40, 100)
      out[i, c] = np.clip(plane + rng.normal(0, 1, plane.shape), 0, 255)
  return out


@pytest.mark.parametrize("kind", ["smooth", "noise", "extremes"])
def test_the_codec_gives_back_every_image_bit_for_bit(kind):
  rng = np.random.default_rng(1)
  images = {"smooth": _smooth_images(20),
            "noise": rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8),
            # residuals that wrap around modulo 256 both ways
            "extremes": (rng.integers(0, 2, (20, 3, 32, 32)) * 255
                         ).astype(np.uint8)}[kind]
  np.testing.assert_array_equal(
      imagecodec.decode(imagecodec.encode(images), len(images)), images)


def test_the_codec_beats_xz_on_pixels_that_look_like_images():
  import lzma  # pylint: disable=import-outside-toplevel
  images = _smooth_images(200)
  plain = len(lzma.compress(images.tobytes(), format=lzma.FORMAT_XZ))
  delta = len(lzma.compress(
      images.tobytes(), format=lzma.FORMAT_XZ,
      filters=[{"id": lzma.FILTER_DELTA, "dist": 1},
               {"id": lzma.FILTER_LZMA2, "preset": 6}]))
  assert len(imagecodec.encode(images)) < 0.9 * min(plain, delta)


def test_the_codec_refuses_what_is_not_rgb_images():
  with pytest.raises(ValueError, match="expected uint8 images"):
    imagecodec.encode(np.zeros((2, 32, 32, 3), np.uint8))


def _release(folder, images=9):
  out = folder / datapack.FOLDER
  out.mkdir(parents=True)
  rng = np.random.default_rng(0)
  for k, name in enumerate(["data_batch_1.bin", "test_batch.bin"]):
    pixels = _smooth_images(images, seed=k).reshape(images, -1)
    labels = rng.integers(0, 10, (images, 1), dtype=np.uint8)
    (out / name).write_bytes(np.concatenate([labels, pixels], 1).tobytes())
  (out / "batches.meta.txt").write_text("airplane\nautomobile\n")
  return out


def test_packing_again_only_cuts_the_parts_again(tmp_path):
  source = _release(tmp_path / "data")
  first = datapack.pack(str(tmp_path / "data"), str(tmp_path / "parts"),
                        part_bytes=4_000)
  assert first["codec"] == imagecodec.NAME
  # a damaged stream would show if the second pack reused it unchecked
  again = datapack.pack(str(source), str(tmp_path / "parts"),
                        part_bytes=50_000)
  assert again["packed_bytes"] == first["packed_bytes"]
  assert len(again["parts"]) < len(first["parts"])
  assert sorted(os.listdir(tmp_path / "parts")) == sorted(
      [datapack.MANIFEST] + [p["name"] for p in again["parts"]])
  folder = datapack.unpack(str(tmp_path / "parts"), str(tmp_path / "dest"))
  for path in source.iterdir():
    assert (tmp_path / "dest" / datapack.FOLDER / path.name).read_bytes() \
        == path.read_bytes()
  assert folder.endswith(datapack.FOLDER)


def test_a_pack_of_another_codec_is_refused_in_one_line(tmp_path):
  _release(tmp_path / "data")
  datapack.pack(str(tmp_path / "data"), str(tmp_path / "parts"), 50_000)
  path = tmp_path / "parts" / datapack.MANIFEST
  manifest = json.loads(path.read_text())
  del manifest["codec"]
  path.write_text(json.dumps(manifest))
  assert datapack.main(["unpack", str(tmp_path / "parts"),
                        str(tmp_path / "dest")]) == 1
  with pytest.raises(ValueError, match="codec 'xz-delta'.*pack it again"):
    datapack.unpack(str(tmp_path / "parts"), str(tmp_path / "dest"))


def test_parts_are_sized_to_what_a_call_leaves_beside_the_tree(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()
  subprocess.run(["git", "init", "-q", str(repo)], check=True)
  (repo / ".gitignore").write_text("/ignored/\n/.whl/\n")
  (repo / "tracked.bin").write_bytes(b"t" * 3_000_000)
  subprocess.run(["git", "-C", str(repo), "add", "tracked.bin"], check=True)
  (repo / "untracked.bin").write_bytes(b"u" * 2_000_000)
  (repo / "ignored").mkdir()
  (repo / "ignored" / "big.bin").write_bytes(b"i" * 5_000_000)
  (repo / ".whl").mkdir()
  (repo / ".whl" / "a.whl").write_bytes(b"w" * 1_000_000)
  travels = 3_000_000 + 2_000_000 + len("/ignored/\n/.whl/\n")
  assert datapack.traveling_bytes(str(repo), []) == travels
  assert datapack.fitting_part_bytes(str(repo), [".whl"]) == (
      datapack.CALL_BYTES - datapack.SLACK_BYTES - travels - 1_000_000)
  (repo / "untracked.bin").write_bytes(b"u" * 62_000_000)
  with pytest.raises(ValueError, match="too little for CIFAR-10"):
    datapack.fitting_part_bytes(str(repo), [".whl"])
  (tmp_path / "plain").mkdir()
  with pytest.raises(ValueError, match="not a git checkout"):
    datapack.traveling_bytes(str(tmp_path / "plain"), [])
