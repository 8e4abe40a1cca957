"""The official CIFAR files' md5 sums, checked once per version of a file.

A file whose size is the official release's is taken to claim to be that
file, and must have its md5: flipped pixel bytes keep the size and the
labels, and would otherwise train silently. Files of other sizes (the small
releases tests write, a subset) are not the official release and are not
checked; `read_cifar_binary(strict_sizes=True)`, the default, refuses them.

Checked: the six CIFAR-10 batch files of `cifar-10-batches-bin/` and the two
official archives. The sums of CIFAR-10's `batches.meta.txt` and of the
files inside the CIFAR-100 archive are not checked: no official copy of them
was at hand to confirm their sums (the archive's md5 covers its members).

Hashing the 180 MB of CIFAR-10 takes about a second, so a file that matched
is remembered, by path, size and modification time, in
`$XDG_CACHE_HOME/fkjax/verified_data.json` (`~/.cache/...`): a second run
does not hash it again, and a rewritten file (a new mtime) is hashed anew.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import NamedTuple

from fkjax import atomic
from fkjax.data.types import DataError

_CHUNK = 1 << 20
CACHE_NAME = "verified_data.json"


class Official(NamedTuple):
  """An official file: its size in bytes and hex md5."""
  size: int
  md5: str


# Checked against the files of this project's copy of CIFAR-10, whose README
# confirms them against the sums published for the official release.
CIFAR10_FILES = {
    "data_batch_1.bin": Official(30_730_000,
                                 "5dd7e06a14cb22eb9f671a540d1b7c25"),
    "data_batch_2.bin": Official(30_730_000,
                                 "5ea93a67294ea407fff1d09f752e9692"),
    "data_batch_3.bin": Official(30_730_000,
                                 "942cd6a4bcdd0dd3c604fbe906cb4421"),
    "data_batch_4.bin": Official(30_730_000,
                                 "ae636b3ba5c66a11e91e8cb52e771fcb"),
    "data_batch_5.bin": Official(30_730_000,
                                 "53f37980c15c3d472c316c40844f3f0d"),
    "test_batch.bin": Official(30_730_000, "803d5f7f4d78ea53de84dbe85f74fb6d"),
}
# The archives as published on the CIFAR page (also what downloads check).
ARCHIVES = {
    "cifar-10-binary.tar.gz": Official(170_052_171,
                                       "c32a1d4ab5d03f1284b67883e8d87530"),
    "cifar-100-binary.tar.gz": Official(168_513_733,
                                        "03b5dce01913d631647c71ecec9e9cb8"),
}


def file_md5(path: str | os.PathLike[str]) -> str:
  """Hex md5 of a file, read in chunks."""
  digest = hashlib.md5(usedforsecurity=False)
  with open(path, "rb") as fh:
    for chunk in iter(lambda: fh.read(_CHUNK), b""):
      digest.update(chunk)
  return digest.hexdigest()


def default_cache_path() -> str:
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "fkjax", CACHE_NAME)


def check_official(path: str | os.PathLike[str], official: Official,
                   where: str, remedy: str,
                   cache_path: str | None = None) -> bool:
  """Refuses a file of ``official``'s size whose md5 is not ``official``'s.

  Args:
    path: the file.
    official: the official file's size and md5.
    where: how messages name the file.
    remedy: what the user should do about a mismatch.
    cache_path: where verified files are remembered (default
      `default_cache_path()`).

  Returns:
    Whether the file was checked (False: another size, not the official
    file).

  Raises:
    DataError: the md5 differs: "<where>: md5 ... differs from the official
      ...; <remedy>".
  """
  stat = os.stat(path)
  if stat.st_size != official.size:
    return False
  cache_path = cache_path or default_cache_path()
  cache = _load(cache_path)
  if cache.get(os.path.realpath(path)) == _entry(stat, official):
    return True
  got = file_md5(path)
  if got != official.md5:
    raise DataError(
        f"{where}: md5 {got} differs from the official release's "
        f"{official.md5} for this file of the official size "
        f"({official.size:,} bytes): it is damaged or altered; {remedy}")
  remember(path, official, cache_path)
  return True


def remember(path: str | os.PathLike[str], official: Official,
             cache_path: str | None = None) -> None:
  """Records that ``path``, as it is now, has ``official``'s md5 (for a
  caller that has just hashed it, e.g. a download)."""
  cache_path = cache_path or default_cache_path()
  cache = _load(cache_path)
  cache[os.path.realpath(path)] = _entry(os.stat(path), official)
  _save(cache_path, cache)


def _entry(stat: os.stat_result, official: Official) -> list:
  return [stat.st_size, stat.st_mtime_ns, official.md5]


def _load(cache_path: str) -> dict[str, list]:
  try:
    with open(cache_path) as f:
      cache = json.load(f)
  except (OSError, ValueError):
    return {}
  return cache if isinstance(cache, dict) else {}


def _save(cache_path: str, cache: dict[str, list]) -> None:
  """Writes the cache atomically; a cache that cannot be written only
  means hashing again next time."""
  try:
    atomic.write_text(cache_path, json.dumps(cache, indent=1, sort_keys=True))
  except OSError:
    pass
