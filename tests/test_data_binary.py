"""Tests of the CIFAR binary reader: round trips, real data, bad input."""
import io
import os
import pathlib
import tarfile

import numpy as np
import pytest

from fkjax import data

_C10_TRAIN = [f"data_batch_{i}.bin" for i in range(1, 6)]


def _real_data_dir():
  env = os.environ.get("FKJAX_DATA_DIR")
  if env:
    return pathlib.Path(env)
  return pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _encode(images, *label_columns):
  """Writes records the slow, obvious way: label bytes then R, G, B planes."""
  out = bytearray()
  for i, img in enumerate(images):
    out += bytes(int(col[i]) for col in label_columns)
    for c in range(3):
      out += np.ascontiguousarray(img[:, :, c]).tobytes()  # row-major plane
  return bytes(out)


def _random_images(rng, n):
  return rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def _cifar10_files(rng, sizes=(3, 2, 4, 1, 2), test_size=3):
  """{filename: (bytes, images, labels)} for a tiny CIFAR-10 release."""
  files = {}
  for f, n in zip(_C10_TRAIN + ["test_batch.bin"], list(sizes) + [test_size]):
    images, labels = _random_images(rng, n), rng.integers(0, 10, n)
    files[f] = (_encode(images, labels), images, labels)
  return files


def _cifar100_files(rng, train=5, test=3):
  files = {}
  for f, n in (("train.bin", train), ("test.bin", test)):
    images = _random_images(rng, n)
    coarse, fine = rng.integers(0, 20, n), rng.integers(0, 100, n)
    files[f] = (_encode(images, coarse, fine), images, fine, coarse)
  return files


def _write_folder(folder, contents):
  folder.mkdir(parents=True, exist_ok=True)
  for f, blob in contents.items():
    (folder / f).write_bytes(blob)


def _write_archive(path, prefix, contents):
  with tarfile.open(path, "w:gz") as tar:
    for f, blob in contents.items():
      info = tarfile.TarInfo(f"{prefix}/{f}")
      info.size = len(blob)
      tar.addfile(info, io.BytesIO(blob))


@pytest.mark.parametrize("as_archive", [False, True])
def test_cifar10_round_trip(tmp_path, as_archive):
  files = _cifar10_files(np.random.default_rng(0))
  blobs = {f: v[0] for f, v in files.items()}
  blobs["batches.meta.txt"] = b"\n".join(b"c%d" % i for i in range(10)) + b"\n"
  if as_archive:
    _write_archive(tmp_path / "cifar-10-binary.tar.gz", "cifar-10-batches-bin",
                   blobs)
  else:
    _write_folder(tmp_path / "cifar-10-batches-bin", blobs)

  got = data.read_cifar_binary(tmp_path, "cifar10", strict_sizes=False)

  np.testing.assert_array_equal(
      got.train.images, np.concatenate([files[f][1] for f in _C10_TRAIN]))
  np.testing.assert_array_equal(
      got.train.labels, np.concatenate([files[f][2] for f in _C10_TRAIN]))
  np.testing.assert_array_equal(got.test.images, files["test_batch.bin"][1])
  np.testing.assert_array_equal(got.test.labels, files["test_batch.bin"][2])
  assert got.train.images.dtype == np.uint8
  assert got.train.labels.dtype == np.int32
  assert got.class_names == tuple(f"c{i}" for i in range(10))


@pytest.mark.parametrize("as_archive", [False, True])
@pytest.mark.parametrize("label", ["fine", "coarse"])
def test_cifar100_round_trip(tmp_path, as_archive, label):
  files = _cifar100_files(np.random.default_rng(1))
  blobs = {f: v[0] for f, v in files.items()}
  if as_archive:
    _write_archive(tmp_path / "cifar-100-binary.tar.gz", "cifar-100-binary",
                   blobs)
  else:
    _write_folder(tmp_path / "cifar-100-binary", blobs)

  got = data.read_cifar_binary(tmp_path, "cifar100", label=label,
                               strict_sizes=False)

  column = 2 if label == "fine" else 3
  for split, f in ((got.train, "train.bin"), (got.test, "test.bin")):
    np.testing.assert_array_equal(split.images, files[f][1])
    np.testing.assert_array_equal(split.labels, files[f][column])
  assert got.class_names == ()  # no meta files written


def test_data_dir_may_be_the_folder_itself_or_come_from_env(tmp_path,
                                                            monkeypatch):
  files = _cifar10_files(np.random.default_rng(2))
  folder = tmp_path / "cifar-10-batches-bin"
  _write_folder(folder, {f: v[0] for f, v in files.items()})
  direct = data.read_cifar_binary(folder, strict_sizes=False)
  monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
  ds = data.load_dataset("cifar10", val_size=2, strict_sizes=False)
  assert ds.source == "cifar_binary" and not ds.is_synthetic
  assert str(folder) in ds.description
  total = ds.train.num_examples + ds.val.num_examples
  assert total == direct.train.num_examples == sum(
      len(files[f][2]) for f in _C10_TRAIN)
  np.testing.assert_array_equal(ds.test.images, direct.test.images)


def test_no_data_is_a_clear_error(monkeypatch, tmp_path):
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  with pytest.raises(data.DataError, match="FKJAX_DATA_DIR"):
    data.load_dataset("cifar10", download=False)


# --- bad input: each case names the file, what was expected, what was found.


def _tiny_cifar10_folder(tmp_path):
  files = _cifar10_files(np.random.default_rng(3))
  folder = tmp_path / "cifar-10-batches-bin"
  _write_folder(folder, {f: v[0] for f, v in files.items()})
  return folder


def test_missing_directory(tmp_path):
  missing = tmp_path / "nope"
  with pytest.raises(data.DataError, match=r"nope: data directory does not "
                     r"exist; expected .*cifar-10-batches-bin/"):
    data.read_cifar_binary(missing)


def test_directory_without_the_release(tmp_path):
  (tmp_path / "something_else.txt").write_text("x")
  with pytest.raises(data.DataError,
                     match=r"cifar-10-binary\.tar\.gz.*found 1 entries: "
                     r"\[something_else\.txt\]"):
    data.read_cifar_binary(tmp_path)


def test_missing_file(tmp_path):
  folder = _tiny_cifar10_folder(tmp_path)
  (folder / "data_batch_3.bin").unlink()
  with pytest.raises(data.DataError,
                     match=r"data_batch_3\.bin: missing file; expected "
                     r"30,730,000 bytes \(10,000 records of 3,073 bytes\)"):
    data.read_cifar_binary(tmp_path, strict_sizes=False)


def test_wrong_size_file_under_strict_sizes(tmp_path):
  _tiny_cifar10_folder(tmp_path)  # 3 records in data_batch_1.bin
  with pytest.raises(data.DataError,
                     match=r"data_batch_1\.bin: wrong size; expected "
                     r"30,730,000 bytes \(10,000 records of 3,073 bytes\), "
                     r"found 9,219 bytes \(3 whole records; truncated\?\)"):
    data.read_cifar_binary(tmp_path)


def test_truncated_file(tmp_path):
  folder = _tiny_cifar10_folder(tmp_path)
  path = folder / "test_batch.bin"
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(data.DataError,
                     match=r"test_batch\.bin: expected a whole, positive "
                     r"number of 3,073-byte records, found 9,119 bytes "
                     r"\(2 records \+ 2,973 stray bytes; truncated\?\)"):
    data.read_cifar_binary(tmp_path, strict_sizes=False)


def test_cifar10_label_out_of_range(tmp_path):
  folder = _tiny_cifar10_folder(tmp_path)
  path = folder / "data_batch_2.bin"
  blob = bytearray(path.read_bytes())
  blob[3073] = 10  # label byte of record 1
  path.write_bytes(bytes(blob))
  with pytest.raises(data.DataError,
                     match=r"data_batch_2\.bin \(fine label\): label out of "
                     r"range: expected 0\.\.9, found 10 at record 1"):
    data.read_cifar_binary(tmp_path, strict_sizes=False)


def test_cifar100_coarse_label_out_of_range_even_when_reading_fine(tmp_path):
  files = _cifar100_files(np.random.default_rng(4))
  blobs = {f: v[0] for f, v in files.items()}
  blob = bytearray(blobs["test.bin"])
  blob[2 * 3074] = 20  # coarse byte of record 2
  blobs["test.bin"] = bytes(blob)
  _write_archive(tmp_path / "cifar-100-binary.tar.gz", "cifar-100-binary",
                 blobs)
  with pytest.raises(data.DataError,
                     match=r"cifar-100-binary\.tar\.gz:cifar-100-binary/"
                     r"test\.bin \(coarse label\): label out of range: "
                     r"expected 0\.\.19, found 20 at record 2"):
    data.read_cifar_binary(tmp_path, "cifar100", strict_sizes=False)


def test_truncated_archive(tmp_path):
  files = _cifar10_files(np.random.default_rng(5))
  archive = tmp_path / "cifar-10-binary.tar.gz"
  _write_archive(archive, "cifar-10-batches-bin",
                 {f: v[0] for f, v in files.items()})
  archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
  with pytest.raises(data.DataError, match=r"cifar-10-binary\.tar\.gz: cannot "
                     r"read the archive .*expected a complete gzip"):
    data.read_cifar_binary(tmp_path, strict_sizes=False)


def test_archive_missing_member(tmp_path):
  files = _cifar10_files(np.random.default_rng(6))
  blobs = {f: v[0] for f, v in files.items() if f != "test_batch.bin"}
  _write_archive(tmp_path / "cifar-10-binary.tar.gz", "cifar-10-batches-bin",
                 blobs)
  with pytest.raises(data.DataError, match=r"missing member "
                     r"cifar-10-batches-bin/test_batch\.bin; expected "
                     r"30,730,000 bytes"):
    data.read_cifar_binary(tmp_path, strict_sizes=False)


# --- the real CIFAR-10 release in ../shared/data (skipped when absent).


@pytest.fixture(scope="module")
def real_cifar10():
  root = _real_data_dir()
  if not (root / "cifar-10-batches-bin").is_dir() and not (
      root / "cifar-10-binary.tar.gz").is_file():
    pytest.skip(f"real CIFAR-10 not found under {root}")
  return root, data.read_cifar_binary(root, "cifar10")


def test_real_cifar10_counts_and_known_values(real_cifar10):
  _, official = real_cifar10
  assert official.train.images.shape == (50_000, 32, 32, 3)
  assert official.test.images.shape == (10_000, 32, 32, 3)
  np.testing.assert_array_equal(np.bincount(official.train.labels), [5000] * 10)
  np.testing.assert_array_equal(np.bincount(official.test.labels), [1000] * 10)
  np.testing.assert_array_equal(official.train.labels[:10],
                                [6, 9, 9, 4, 1, 1, 2, 7, 8, 3])
  np.testing.assert_array_equal(official.test.labels[:10],
                                [3, 8, 8, 0, 6, 6, 1, 6, 3, 1])
  # Values printed from the official pickles: red plane starts 59 43 50, blue
  # plane ends 140 84 72 (train image 0); test image 0: 158 159 165 / 124 129
  # 110.
  np.testing.assert_array_equal(official.train.images[0, 0, :3, 0],
                                [59, 43, 50])
  np.testing.assert_array_equal(official.train.images[0, -1, -3:, 2],
                                [140, 84, 72])
  np.testing.assert_array_equal(official.test.images[0, 0, :3, 0],
                                [158, 159, 165])
  np.testing.assert_array_equal(official.test.images[0, -1, -3:, 2],
                                [124, 129, 110])
  assert official.class_names[0] == "airplane"
  assert official.class_names[-1] == "truck"


def test_real_cifar10_channel_means(real_cifar10):
  _, official = real_cifar10
  # Exact moments from per-channel histograms: far cheaper than a float
  # reduction over 150M strided bytes.
  values = np.arange(256) / 255.0
  flat = official.train.images.reshape(-1, 3)
  hists = [np.bincount(flat[:, c], minlength=256) for c in range(3)]
  mean = np.array([h @ values / h.sum() for h in hists])
  var = np.array([h @ values**2 / h.sum() for h in hists]) - mean**2
  np.testing.assert_allclose(mean, [0.4914, 0.4822, 0.4465], atol=5e-4)
  np.testing.assert_allclose(np.sqrt(var), [0.2470, 0.2435, 0.2616], atol=5e-4)


def test_real_cifar10_load_dataset_split(real_cifar10, monkeypatch):
  root, official = real_cifar10
  monkeypatch.setenv(data.DATA_DIR_ENV, str(root))
  ds = data.load_dataset("cifar10")
  assert (ds.train.num_examples, ds.val.num_examples,
          ds.test.num_examples) == (45_000, 5_000, 10_000)
  assert ds.num_classes == 10 and ds.name == "cifar10"
  # train and val partition the official set: same label counts, no overlap
  # in pixels (the official train set has no duplicate images).
  np.testing.assert_array_equal(
      np.bincount(ds.train.labels, minlength=10) +
      np.bincount(ds.val.labels, minlength=10), [5000] * 10)
  row = np.dtype((np.void, 32 * 32 * 3))
  train_rows = ds.train.images.reshape(45_000, -1).view(row).ravel()
  val_rows = ds.val.images.reshape(5_000, -1).view(row).ravel()
  assert np.intersect1d(train_rows, val_rows).size == 0
  small = data.load_dataset("cifar10", subset_per_class=10,
                            test_subset_per_class=5)
  np.testing.assert_array_equal(np.bincount(small.train.labels), [10] * 10)
  np.testing.assert_array_equal(np.bincount(small.test.labels), [5] * 10)
  np.testing.assert_array_equal(small.val.labels, ds.val.labels)


# --------------------------------------------------------------------------
# The official files' md5 sums (fkjax.data.integrity).


def _official_size_batch(rng):
  """A CIFAR-10 batch of the official size (10,000 records) that is not the
  official file: labels in range, random pixels."""
  labels = rng.integers(0, 10, 10_000).astype(np.uint8)
  records = rng.integers(0, 256, (10_000, 3073), dtype=np.uint8)
  records[:, 0] = labels
  return records.tobytes()


@pytest.fixture
def md5_calls(monkeypatch, tmp_path):
  """The files hashed, with the verified-files cache under tmp_path."""
  from fkjax.data import integrity
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  calls = []
  real = integrity.file_md5

  def counted(path):
    calls.append(os.path.basename(path))
    return real(path)
  monkeypatch.setattr(integrity, "file_md5", counted)
  return calls


def _release_with_official_size_batch(tmp_path):
  """A tiny release whose data_batch_1.bin has the official size."""
  blobs = {f: v[0] for f, v in
           _cifar10_files(np.random.default_rng(1)).items()}
  blobs["data_batch_1.bin"] = _official_size_batch(np.random.default_rng(2))
  folder = tmp_path / "cifar-10-batches-bin"
  _write_folder(folder, blobs)
  return folder


def test_a_file_of_the_official_size_must_be_the_official_file(tmp_path,
                                                               md5_calls):
  folder = _release_with_official_size_batch(tmp_path)
  with pytest.raises(data.DataError) as info:
    data.read_cifar_binary(tmp_path, "cifar10", strict_sizes=False)
  message = str(info.value)
  assert message.startswith(f"{folder / 'data_batch_1.bin'}: md5 ")
  assert "differs from the official release's " \
         "5dd7e06a14cb22eb9f671a540d1b7c25" in message
  assert "damaged or altered" in message
  assert "python -m fkjax.data.download cifar10" in message
  # Files of other sizes (the tiny ones) are not the official release.
  assert md5_calls == ["data_batch_1.bin"]


def test_a_verified_file_is_hashed_once_until_it_changes(tmp_path, md5_calls,
                                                         monkeypatch):
  from fkjax.data import integrity
  folder = _release_with_official_size_batch(tmp_path)
  batch = folder / "data_batch_1.bin"
  monkeypatch.setitem(integrity.CIFAR10_FILES, "data_batch_1.bin",
                      integrity.Official(batch.stat().st_size,
                                         integrity.file_md5(batch)))
  md5_calls.clear()
  for _ in range(2):
    got = data.read_cifar_binary(tmp_path, "cifar10", strict_sizes=False)
  assert got.train.images.shape[0] == 10_000 + 2 + 4 + 1 + 2
  assert md5_calls == ["data_batch_1.bin"]   # the second read trusted it
  # One pixel byte flipped (size and labels intact): hashed again, refused.
  blob = bytearray(batch.read_bytes())
  blob[3073 * 5000 + 100] ^= 0xFF
  batch.write_bytes(bytes(blob))
  os.utime(batch, ns=(batch.stat().st_atime_ns,
                      batch.stat().st_mtime_ns + 1_000_000))
  with pytest.raises(data.DataError, match=f"^{batch}: md5 "):
    data.read_cifar_binary(tmp_path, "cifar10", strict_sizes=False)
  assert md5_calls == ["data_batch_1.bin"] * 2


def test_an_archive_of_the_official_size_must_be_the_official_one(
    tmp_path, md5_calls, monkeypatch):
  from fkjax.data import integrity
  blobs = {f: v[0] for f, v in _cifar100_files(
      np.random.default_rng(0)).items()}
  archive = tmp_path / "cifar-100-binary.tar.gz"
  _write_archive(archive, "cifar-100-binary", blobs)
  data.read_cifar_binary(tmp_path, "cifar100", strict_sizes=False)
  assert not md5_calls   # not the official size: a test's own archive
  # The same archive, were it of the official size, is not the official one.
  monkeypatch.setitem(integrity.ARCHIVES, "cifar-100-binary.tar.gz",
                      integrity.Official(archive.stat().st_size,
                                         "03b5dce01913d631647c71ecec9e9cb8"))
  with pytest.raises(data.DataError, match=f"^{archive}: md5 .* differs"):
    data.read_cifar_binary(tmp_path, "cifar100", strict_sizes=False)


def test_real_cifar10_with_a_flipped_pixel_byte_is_refused(
    real_cifar10, tmp_path, md5_calls):
  root, _ = real_cifar10
  source = root / "cifar-10-batches-bin" / "test_batch.bin"
  if not source.is_file():
    pytest.skip("the real CIFAR-10 here is an archive")
  copy = tmp_path / "cifar-10-batches-bin" / "test_batch.bin"
  copy.parent.mkdir()
  blob = bytearray(source.read_bytes())
  blob[3073 * 1234 + 1 + 512] ^= 0x01   # a pixel of image 1,234, not a label
  copy.write_bytes(bytes(blob))
  with pytest.raises(data.DataError, match=f"^{copy}: md5 .* "
                     "803d5f7f4d78ea53de84dbe85f74fb6d"):
    data.read_cifar_binary(tmp_path, "cifar10")
