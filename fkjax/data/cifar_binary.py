"""NumPy reader for the original CIFAR-10 / CIFAR-100 binary release.

Reads either the extracted folder (`cifar-10-batches-bin/`, `cifar-100-binary/`)
or the official archive (`cifar-10-binary.tar.gz`, `cifar-100-binary.tar.gz`)
without extracting it to disk. No pickle is involved anywhere.

Record layout: CIFAR-10 is 1 label byte + 3072 pixel bytes; CIFAR-100 is a
coarse label byte, a fine label byte, then 3072 pixel bytes. The pixels are
the red, green and blue 32x32 planes, each row-major.
"""
from __future__ import annotations

import dataclasses
import os
import tarfile
import zlib

import numpy as np

from fkjax.data import integrity
from fkjax.data.types import DataError
from fkjax.data.types import IMAGE_SIZE
from fkjax.data.types import NUM_CLASSES
from fkjax.data.types import OfficialSplits
from fkjax.data.types import Split
from fkjax.data.types import check_labels

_PIXEL_BYTES = 3 * IMAGE_SIZE * IMAGE_SIZE
# Errors that tarfile / gzip raise on a truncated or corrupt archive.
_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Where the official release keeps each file and how records look."""
  folder: str
  archive: str
  train_files: tuple[str, ...]
  test_files: tuple[str, ...]
  records_per_file: dict[str, int]
  # Label names in the order the label bytes appear in a record.
  label_fields: tuple[str, ...]
  num_classes: dict[str, int]  # label field -> number of classes
  meta_files: dict[str, str]  # label field -> class-name file

  @property
  def record_size(self) -> int:
    return len(self.label_fields) + _PIXEL_BYTES


_LAYOUTS = {
    "cifar10": _Layout(
        folder="cifar-10-batches-bin",
        archive="cifar-10-binary.tar.gz",
        train_files=tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
        test_files=("test_batch.bin",),
        records_per_file={
            **{f"data_batch_{i}.bin": 10_000 for i in range(1, 6)},
            "test_batch.bin": 10_000,
        },
        label_fields=("fine",),
        num_classes={"fine": NUM_CLASSES[("cifar10", "fine")]},
        meta_files={"fine": "batches.meta.txt"},
    ),
    "cifar100": _Layout(
        folder="cifar-100-binary",
        archive="cifar-100-binary.tar.gz",
        train_files=("train.bin",),
        test_files=("test.bin",),
        records_per_file={"train.bin": 50_000, "test.bin": 10_000},
        label_fields=("coarse", "fine"),
        num_classes={"coarse": NUM_CLASSES[("cifar100", "coarse")],
                     "fine": NUM_CLASSES[("cifar100", "fine")]},
        meta_files={
            "coarse": "coarse_label_names.txt",
            "fine": "fine_label_names.txt",
        },
    ),
}


def record_size(name: str) -> int:
  """Bytes per record: 3073 for "cifar10", 3074 for "cifar100"."""
  return _layout(name).record_size


def read_cifar_binary(
    data_dir: str | os.PathLike[str],
    name: str = "cifar10",
    *,
    label: str = "fine",
    strict_sizes: bool = True,
) -> OfficialSplits:
  """Reads the CIFAR binary release from a folder or the official archive.

  Args:
    data_dir: a directory containing `cifar-10-batches-bin/` (or
      `cifar-100-binary/`) or the `.tar.gz` archive, that extracted folder
      itself, or the path of the archive.
    name: "cifar10" or "cifar100".
    label: "fine" (the 100 classes; the only choice for CIFAR-10) or
      "coarse" (the 20 CIFAR-100 superclasses).
    strict_sizes: require the official number of records in every file
      (10,000 per CIFAR-10 file; 50,000 / 10,000 for CIFAR-100). When False
      any whole, positive number of records is accepted (for small fixtures).

  Returns:
    The train and test splits in file order, with uint8 NHWC images and int32
    labels.

  Raises:
    DataError: naming the path, what was expected and what was found, when
      the folder or archive is missing, a file is missing, truncated or of the
      wrong size, or a label is out of range.
  """
  layout = _layout(name)
  if label not in layout.label_fields:
    raise ValueError(
        f"label={label!r} is not available for {name}; choose from "
        f"{layout.label_fields}")
  kind, location = _locate(os.fspath(data_dir), name)
  wanted = layout.train_files + layout.test_files
  _check_official(kind, location, name, layout)
  if kind == "archive":
    raw, meta = _read_archive(location, layout, wanted)
  else:
    raw, meta = _read_folder(location, layout, wanted)

  splits = []
  for files in (layout.train_files, layout.test_files):
    parts = [
        _decode(raw[f], layout, label, _where(kind, location, layout, f),
                strict_sizes, layout.records_per_file[f])
        for f in files
    ]
    splits.append(Split(np.concatenate([p.images for p in parts]),
                        np.concatenate([p.labels for p in parts])))
  class_names = _parse_names(
      meta.get(label), _where(kind, location, layout, layout.meta_files[label]),
      layout.num_classes[label])
  return OfficialSplits(splits[0], splits[1], class_names, location)


def _layout(name: str) -> _Layout:
  try:
    return _LAYOUTS[name]
  except KeyError:
    raise ValueError(
        f"unknown CIFAR dataset {name!r}; expected one of "
        f"{sorted(_LAYOUTS)}") from None


def archive_name(name: str) -> str:
  """File name of the official archive: "cifar-10-binary.tar.gz", ..."""
  return _layout(name).archive


def folder_name(name: str) -> str:
  """Name of the extracted folder: "cifar-10-batches-bin", ..."""
  return _layout(name).folder


def locate(data_dir: str | os.PathLike[str], name: str = "cifar10"
          ) -> tuple[str, str] | None:
  """Finds the release of `name` at `data_dir` without reading it.

  Args:
    data_dir: as for `read_cifar_binary`.
    name: "cifar10" or "cifar100".

  Returns:
    ("folder" | "archive", path) where the release is, or None when it is
    absent: `data_dir` does not exist, or is a directory holding neither the
    folder nor the archive (the case a download can fix).

  Raises:
    DataError: when `data_dir` is a regular file that is not a `.tar.gz`.
  """
  root = os.fspath(data_dir)
  layout = _layout(name)
  if os.path.isfile(root):
    if root.endswith((".tar.gz", ".tgz")):
      return "archive", root
    raise DataError(f"{root}: expected {_expected(layout)}; found a regular "
                    "file")
  if not os.path.isdir(root):
    return None
  if os.path.isdir(os.path.join(root, layout.folder)):
    return "folder", os.path.join(root, layout.folder)
  if os.path.isfile(os.path.join(root, layout.archive)):
    return "archive", os.path.join(root, layout.archive)
  own_files = layout.train_files + layout.test_files
  if (os.path.basename(os.path.normpath(root)) == layout.folder or
      any(os.path.exists(os.path.join(root, f)) for f in own_files)):
    return "folder", root
  return None


def _expected(layout: _Layout) -> str:
  return (f"a directory containing {layout.folder}/ or {layout.archive}, "
          "that folder itself, or the archive")


def _locate(root: str, name: str) -> tuple[str, str]:
  """Returns ("folder" | "archive", path) for the release found at `root`."""
  layout = _layout(name)
  found = locate(root, name)
  if found is not None:
    return found
  if not os.path.isdir(root):
    raise DataError(f"{root}: data directory does not exist; expected "
                    f"{_expected(layout)}")
  entries = sorted(os.listdir(root))
  shown = ", ".join(entries[:10]) + (", ..." if len(entries) > 10 else "")
  raise DataError(f"{root}: expected {_expected(layout)}; found "
                  f"{len(entries)} entries: [{shown}]")


def _read_folder(
    folder: str, layout: _Layout, wanted: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
  raw = {}
  for f in wanted:
    path = os.path.join(folder, f)
    if not os.path.isfile(path):
      raise DataError(
          f"{path}: missing file; expected {_describe(layout, f)}")
    raw[f] = np.fromfile(path, dtype=np.uint8)
  meta = {}
  for field, f in layout.meta_files.items():
    path = os.path.join(folder, f)
    if os.path.isfile(path):
      with open(path, "rb") as fh:
        meta[field] = fh.read()
  return raw, meta


def _read_archive(
    archive: str, layout: _Layout, wanted: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
  """Reads the wanted members in one sequential pass over the gzip stream."""
  by_member = {f"{layout.folder}/{f}": f for f in wanted}
  meta_by_member = {f"{layout.folder}/{f}": field
                    for field, f in layout.meta_files.items()}
  raw, meta = {}, {}
  try:
    with tarfile.open(archive, mode="r:gz") as tar:
      # Iterating (instead of getmember) avoids re-decompressing from the
      # start for each member: gzip streams cannot seek backwards cheaply.
      for member in tar:
        member_name = member.name.removeprefix("./")
        if member_name not in by_member and member_name not in meta_by_member:
          continue
        if not member.isfile():
          raise DataError(f"{archive}: member {member_name} is not a regular "
                          "file")
        fh = tar.extractfile(member)
        data = fh.read() if fh is not None else b""
        if member_name in by_member:
          raw[by_member[member_name]] = np.frombuffer(data, dtype=np.uint8)
        else:
          meta[meta_by_member[member_name]] = data
  except _ARCHIVE_ERRORS as e:
    raise DataError(
        f"{archive}: cannot read the archive ({type(e).__name__}: {e}); "
        f"expected a complete gzip-compressed tar holding {layout.folder}/"
    ) from e
  missing = [f for f in wanted if f not in raw]
  if missing:
    raise DataError(
        f"{archive}: missing member {layout.folder}/{missing[0]}; expected "
        f"{_describe(layout, missing[0])} (missing: {', '.join(missing)})")
  return raw, meta


def _check_official(kind: str, location: str, name: str,
                    layout: _Layout) -> None:
  """Refuses files of the official size that are not the official files
  (see `fkjax.data.integrity`)."""
  get = f"`python -m fkjax.data.download {name} --data-dir DIR` fetches it"
  if kind == "archive":
    official = integrity.ARCHIVES.get(layout.archive)
    if official is not None:
      integrity.check_official(
          location, official, location,
          f"delete it and download the official archive again ({get})")
    return
  files = integrity.CIFAR10_FILES if name == "cifar10" else {}
  for f, official in files.items():
    path = os.path.join(location, f)
    if os.path.isfile(path):
      integrity.check_official(
          path, official, path,
          f"replace {location} with the official release (delete it; "
          f"{get.replace('fetches it', 'fetches the archive')})")


def _where(kind: str, location: str, layout: _Layout, f: str) -> str:
  """Names a file for error messages, inside the archive where relevant."""
  if kind == "archive":
    return f"{location}:{layout.folder}/{f}"
  return os.path.join(location, f)


def _describe(layout: _Layout, f: str) -> str:
  n = layout.records_per_file[f]
  return (f"{n * layout.record_size:,} bytes ({n:,} records of "
          f"{layout.record_size:,} bytes)")


def _decode(data: np.ndarray, layout: _Layout, label: str, where: str,
            strict_sizes: bool, official_records: int) -> Split:
  """Checks the size and labels of one file's bytes and decodes its records."""
  rec = layout.record_size
  size = int(data.size)
  if strict_sizes and size != official_records * rec:
    raise DataError(
        f"{where}: wrong size; expected {official_records * rec:,} bytes "
        f"({official_records:,} records of {rec:,} bytes), found {size:,} "
        f"bytes ({size // rec:,} whole records"
        + (f" + {size % rec:,} stray bytes" if size % rec else "")
        + ("; truncated?" if size < official_records * rec else "") + ")")
  if size == 0 or size % rec:
    raise DataError(
        f"{where}: expected a whole, positive number of {rec:,}-byte records, "
        f"found {size:,} bytes ({size // rec:,} records + {size % rec:,} stray "
        "bytes; truncated?)")
  rows = data.reshape(-1, rec)
  labels = None
  for i, field in enumerate(layout.label_fields):
    field_labels = rows[:, i]
    # Check every label byte so that a corrupt coarse label is caught even
    # when the fine one is used.
    check_labels(field_labels, layout.num_classes[field],
                 f"{where} ({field} label)")
    if field == label:
      labels = field_labels.astype(np.int32)
  nlab = len(layout.label_fields)
  images = rows[:, nlab:].reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE)
  return Split(np.ascontiguousarray(images.transpose(0, 2, 3, 1)), labels)


def _parse_names(data: bytes | None, where: str, num: int) -> tuple[str, ...]:
  if data is None:
    return ()
  names = tuple(line.strip() for line in data.decode("utf-8").splitlines()
                if line.strip())
  if len(names) != num:
    raise DataError(f"{where}: expected {num} class names, one per line; "
                    f"found {len(names)}")
  return names
