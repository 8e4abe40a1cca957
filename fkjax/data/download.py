"""Command line: download the official CIFAR binary archives.

  python -m fkjax.data.download cifar10 [cifar100] [--data-dir DIR]
      [--base-url URL]

DIR defaults to $FKJAX_DATA_DIR, else `~/.cache/fkjax/data` (under
$XDG_CACHE_HOME when set). A release already there is kept: an archive is
checked against the official md5, an extracted folder is left as it is.
A failure prints one line `error: ...` and exits with status 1.

The implementation is `fkjax.data.fetch`; this module is not imported by the
package, so that `python -m` runs it without a second copy.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from fkjax import argtypes
from fkjax.data import cifar_binary
from fkjax.data import fetch
from fkjax.data.types import DISPLAY_NAMES
from fkjax.data.types import DataError


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the command; returns the exit status."""
  parser = argparse.ArgumentParser(
      prog="python -m fkjax.data.download",
      description="Download the official CIFAR-10/100 binary archives "
      "(md5-checked) into the data directory fkjax reads.")
  parser.add_argument("names", nargs="+", choices=sorted(fetch.ARCHIVES),
                      metavar="{cifar10,cifar100}", help="datasets to fetch")
  parser.add_argument(
      "--data-dir", default=None,
      help=f"target directory (default: ${fetch.DATA_DIR_ENV}, else "
      f"{fetch.default_data_dir()})")
  parser.add_argument(
      "--base-url", default=None,
      help=f"folder URL holding the archives (default: ${fetch.BASE_URL_ENV}, "
      f"else {fetch.DEFAULT_BASE_URL})")
  parser.add_argument("--timeout", type=argtypes.positive_seconds,
                      default=fetch.DEFAULT_TIMEOUT_S,
                      help="seconds a connect or read may block")
  args = parser.parse_args(argv)
  root = fetch.resolve_data_dir(args.data_dir)
  try:
    for name in dict.fromkeys(args.names):
      _one(name, root, args.base_url, args.timeout)
  except DataError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


def _one(name: str, root: str, base_url: str | None, timeout: float) -> None:
  display = DISPLAY_NAMES[name]
  archive = os.path.join(root, fetch.ARCHIVES[name].filename)
  found = cifar_binary.locate(root, name)
  if found is not None and os.path.abspath(found[1]) != os.path.abspath(
      archive):
    print(f"{display}: already at {found[1]} ({found[0]}); nothing to do")
    return
  if found is not None:
    md5 = fetch.file_md5(archive)
    expected = fetch.ARCHIVES[name].md5
    if md5 != expected:
      raise DataError(
          f"{archive}: md5 is {md5}, expected {expected} (damaged or another "
          "file); delete it and run this command again")
    print(f"{display}: {archive} is present and its md5 matches; nothing to "
          "do")
    return
  path = fetch.download_cifar(name, root, base_url=base_url, timeout=timeout)
  print(f"{display}: {path} (md5 {fetch.ARCHIVES[name].md5} checked)")


if __name__ == "__main__":
  sys.exit(main())
