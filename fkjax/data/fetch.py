"""Download of the official CIFAR-10/100 binary archives, md5-checked.

The archives come from the CIFAR page of the University of Toronto (the URLs
torchvision uses too) and are kept as they are: `read_cifar_binary` reads the
`.tar.gz` without extracting it. A download goes to a hidden temporary file in
the target directory and is renamed to its final name only after its length
and md5 have been checked, so an interrupted or corrupt download never leaves
a file that would be read as data.

The command line is `python -m fkjax.data.download` (see that module).
"""
from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import sys
from typing import IO, NamedTuple
import urllib.error
import urllib.request

from fkjax import environment
from fkjax.data import cifar_binary
from fkjax.data import integrity
from fkjax.data.integrity import file_md5  # noqa: F401 (fetch.file_md5, as before)
from fkjax.data.types import DISPLAY_NAMES
from fkjax.data.types import DataError

DATA_DIR_ENV = "FKJAX_DATA_DIR"
BASE_URL_ENV = "FKJAX_CIFAR_URL"
DEFAULT_BASE_URL = "https://www.cs.toronto.edu/~kriz/"
DEFAULT_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


class Archive(NamedTuple):
  """One official archive.

  Attributes:
    filename: file name on the server and on disk.
    md5: hex md5 of the whole archive, as published with the dataset.
    size: its size in bytes, for messages (the check uses Content-Length).
  """
  filename: str
  md5: str
  size: int


ARCHIVES = {
    name: Archive(cifar_binary.archive_name(name),
                  integrity.ARCHIVES[cifar_binary.archive_name(name)].md5,
                  integrity.ARCHIVES[cifar_binary.archive_name(name)].size)
    for name in ("cifar10", "cifar100")
}


def default_data_dir() -> str:
  """The per-user data directory: `$XDG_CACHE_HOME/fkjax/data`.

  `~/.cache/fkjax/data` when XDG_CACHE_HOME is unset or empty.
  """
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "fkjax", "data")


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> str:
  """`data_dir` if given, else $FKJAX_DATA_DIR, else `default_data_dir()`."""
  if data_dir is not None and os.fspath(data_dir):
    return os.fspath(data_dir)
  return environment.text(DATA_DIR_ENV) or default_data_dir()


def archive_url(name: str, base_url: str | None = None) -> str:
  """URL of the archive of `name` under `base_url`.

  Args:
    name: "cifar10" or "cifar100".
    base_url: folder URL holding the archives; None means $FKJAX_CIFAR_URL,
      else the official page. Any scheme urllib opens works (https, http,
      file).
  """
  base = base_url or environment.text(BASE_URL_ENV) or DEFAULT_BASE_URL
  return base.rstrip("/") + "/" + _archive(name).filename


def download_cifar(
    name: str = "cifar10",
    data_dir: str | os.PathLike[str] | None = None,
    *,
    base_url: str | None = None,
    md5: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> str:
  """Downloads the archive of `name` into `data_dir`, replacing any there.

  Args:
    name: "cifar10" or "cifar100".
    data_dir: target directory, created if needed; None resolves as in
      `resolve_data_dir`.
    base_url: see `archive_url`.
    md5: expected hex md5; None means the official archive's. Tests serving
      their own archive pass its md5 here.
    timeout: seconds a connect or a read may block before the download fails.

  Returns:
    The path of the verified archive, `<data_dir>/<archive file name>`.

  Raises:
    DataError: when the download fails, is cut short or does not match the
      md5; the message says what to do. No file is left behind then.
  """
  root = resolve_data_dir(data_dir)
  url = archive_url(name, base_url)
  dest = os.path.join(root, _archive(name).filename)
  _log(f"fkjax: downloading {DISPLAY_NAMES[name]} from {url} to {dest} "
       f"({_mib(name)})")
  _fetch(name, url, dest, md5 or _archive(name).md5, timeout)
  return dest


def ensure_cifar(
    name: str = "cifar10",
    data_dir: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    base_url: str | None = None,
    md5: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> tuple[str, str]:
  """Makes sure the release of `name` is at `data_dir`, downloading if not.

  Nothing is fetched when `cifar_binary.locate` finds the folder or the
  archive there; their content is checked by the reader, not here.

  Args:
    name: "cifar10" or "cifar100".
    data_dir: as for `read_cifar_binary`; None resolves as in
      `resolve_data_dir`.
    download: whether a missing release may be downloaded.
    base_url, md5, timeout: as for `download_cifar`.

  Returns:
    ("folder" | "archive", path) of the release.

  Raises:
    DataError: when the release is missing and `download` is False (the
      message names the download command), or when the download fails.
  """
  root = resolve_data_dir(data_dir)
  found = cifar_binary.locate(root, name)
  if found is not None:
    return found
  display = DISPLAY_NAMES[name]
  filename = _archive(name).filename
  what = f"{display} not found in {root}"
  if root.endswith((".tar.gz", ".tgz")):
    # A missing archive path: there is no directory to download into.
    raise DataError(f"{root}: no such archive ({what}); pass the directory "
                    f"that should hold {filename} instead")
  if not download:
    raise DataError(
        f"{what} (expected {_release_names(name)}) and downloading is off "
        "(download=False, config.dataset.download): run `python -m "
        f"fkjax.data.download {name} --data-dir {root}`, or set "
        f"{DATA_DIR_ENV} (or config.dataset.data_dir) to a folder that holds "
        "it")
  url = archive_url(name, base_url)
  dest = os.path.join(root, filename)
  _log(f"fkjax: {what}; downloading {url} to {dest} ({_mib(name)}; "
       "config.dataset.download=False turns this off)")
  _fetch(name, url, dest, md5 or _archive(name).md5, timeout)
  return "archive", dest


def _archive(name: str) -> Archive:
  try:
    return ARCHIVES[name]
  except KeyError:
    raise ValueError(f"unknown CIFAR dataset {name!r}; expected one of "
                     f"{sorted(ARCHIVES)}") from None


def _release_names(name: str) -> str:
  return (f"{cifar_binary.folder_name(name)}/ or "
          f"{cifar_binary.archive_name(name)}")


def _mib(name: str) -> str:
  return f"{_archive(name).size / (1 << 20):.0f} MiB"


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


# What urllib / http.client / sockets raise when a transfer fails; OSError
# covers timeouts, refused or reset connections and a full disk.
_TRANSFER_ERRORS = (urllib.error.URLError, http.client.HTTPException, OSError,
                    ValueError)


def _fetch(name: str, url: str, dest: str, md5: str, timeout: float) -> None:
  """Streams `url` into a temporary file next to `dest`, checks, renames."""
  root = os.path.dirname(dest) or "."
  filename = os.path.basename(dest)
  hint = (f"download {url} by other means, check that its md5 is {md5} and "
          f"put it in {root}; or set {DATA_DIR_ENV} to a folder holding "
          f"{_release_names(name)}")
  try:
    os.makedirs(root, exist_ok=True)
  except OSError as e:
    raise DataError(f"cannot create the data directory {root} ({e}); pass "
                    f"another one (--data-dir, config.dataset.data_dir or "
                    f"{DATA_DIR_ENV})") from e
  # Hidden, with a suffix the reader never looks for, and unique per call so
  # that concurrent downloads (several hosts on one file system) do not mix.
  part = os.path.join(
      root, f".{filename}.{os.getpid()}.{secrets.token_hex(4)}.part")
  try:
    try:
      received, expected_size, got_md5 = _stream(url, part, filename,
                                                 timeout)
    except _TRANSFER_ERRORS as e:
      reason = (e if isinstance(e, urllib.error.HTTPError) else
                getattr(e, "reason", None) or e)
      raise DataError(
          f"cannot download {url} ({type(e).__name__}: {reason}); nothing "
          f"was kept. Check the network connection (proxies are read from "
          f"https_proxy / http_proxy) and run again, or {hint}") from e
    if expected_size is not None and received != expected_size:
      raise DataError(
          f"download of {url} was cut short: received {received:,} of "
          f"{expected_size:,} bytes; nothing was kept. Run again to retry, "
          f"or {hint}")
    if got_md5 != md5:
      raise DataError(
          f"{url}: md5 of the {received:,} bytes received is {got_md5}, "
          f"expected {md5}; nothing was kept. The file was damaged in transit "
          f"or the server ({BASE_URL_ENV}) serves another file. Run again, or "
          f"{hint}")
    os.replace(part, dest)
    official = integrity.ARCHIVES.get(filename)
    if official is not None and official.md5 == md5:
      integrity.remember(dest, official)   # hashed just now: not again
  finally:
    # Reached with `part` still present only on failure (or interruption).
    if os.path.lexists(part):
      try:
        os.unlink(part)
      except OSError:
        pass


def _stream(url: str, part: str, label: str, timeout: float
           ) -> tuple[int, int | None, str]:
  """Writes the body of `url` to `part`: (bytes, Content-Length, md5)."""
  digest = hashlib.md5(usedforsecurity=False)
  received = 0
  with urllib.request.urlopen(url, timeout=timeout) as response:
    length = response.headers.get("Content-Length")
    expected_size = int(length) if length and length.isdigit() else None
    # O_EXCL: never write through a file or link that is already there.
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as out, _Progress(label,
                                                expected_size) as progress:
      # http.client returns b"" (no error) when the server closes the
      # connection early, so the caller compares `received` with the length.
      for chunk in iter(lambda: response.read(_CHUNK), b""):
        out.write(chunk)
        digest.update(chunk)
        received += len(chunk)
        progress.update(len(chunk))
      out.flush()
      os.fsync(out.fileno())
  return received, expected_size, digest.hexdigest()


class _Progress:
  """A tqdm bar on a terminal, else a plain line every 10% (or 16 MiB)."""

  def __init__(self, label: str, total: int | None,
               stream: IO[str] | None = None):
    self._label = label
    self._total = total
    self._stream = stream or sys.stderr
    self._done = 0
    self._shown = -1
    self._next_line = 0
    self._bar = None
    try:
      import tqdm  # pylint: disable=g-import-not-at-top
    except ImportError:
      return
    bar = tqdm.tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                    desc=label, file=self._stream, disable=None, leave=True)
    if bar.disable:  # disable=None: not a terminal
      bar.close()
    else:
      self._bar = bar

  def __enter__(self) -> _Progress:
    return self

  def __exit__(self, *exc) -> None:
    if self._bar is not None:
      self._bar.close()
    elif exc[0] is None and self._done != self._shown:
      self._line()

  def update(self, n: int) -> None:
    self._done += n
    if self._bar is not None:
      self._bar.update(n)
      return
    if self._done >= self._next_line:
      self._line()
      step = self._total // 10 if self._total else 16 << 20
      self._next_line = self._done + max(step, 1)

  def _line(self) -> None:
    self._shown = self._done
    mib = self._done / (1 << 20)
    if self._total:
      text = (f"{mib:.1f} of {self._total / (1 << 20):.1f} MiB "
              f"({100 * self._done // self._total}%)")
    else:
      text = f"{mib:.1f} MiB"
    print(f"  {self._label}: {text}", file=self._stream, flush=True)
