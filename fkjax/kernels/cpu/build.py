"""Builds and loads fkjax's CPU library (oneDNN convolutions, fused noise).

The C++ sources (``onednn_conv.cc``, XLA FFI handlers around oneDNN, and
``noise_cpu.cc``, the fused noise injection) are compiled once per
source, jaxlib and oneDNN version into a cache folder, with the machine's
C++ compiler, against the oneDNN that pip installed
(``pip install -e ".[cpu]"``: ``onednn-cpu-gomp`` / ``onednn-devel-cpu-gomp``
put ``include/`` and ``lib/libdnnl.so`` under ``sys.prefix``). Nothing is
built at install time, so installing fkjax never needs a compiler; without
one, or without oneDNN, :func:`load` says why and fkjax keeps XLA's
convolutions.

A build is written under a temporary name in the cache folder and renamed
into place, then a ``.sha256`` file beside it records its digest. A cached
library is loaded only if its digest matches: a truncated or overwritten
file (a full disk, an interrupted copy) is rebuilt instead of being loaded,
which could crash the process or fail on every run.

Environment:
  ``FKJAX_ONEDNN_ROOT``   a oneDNN install (``include/``, ``lib/``) to use
                          instead of ``sys.prefix`` (e.g. ``/usr``).
  ``FKJAX_ONEDNN_CACHE``  where the built library goes
                          (default ``~/.cache/fkjax/onednn``).
  ``CXX``                 the compiler (default ``c++``).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import jax
import jaxlib

from fkjax import atomic
from fkjax import environment

SOURCES = tuple(pathlib.Path(__file__).with_name(name)
                for name in ("onednn_conv.cc", "noise_cpu.cc"))
TARGETS = {  # FFI target name -> exported symbol
    "fkjax_onednn_conv_fwd": "FkjaxOnednnConvFwd",
    "fkjax_onednn_conv_bwd_data": "FkjaxOnednnConvBwdData",
    "fkjax_onednn_conv_bwd_weights": "FkjaxOnednnConvBwdWeights",
    "fkjax_noise_inject_fwd": "FkjaxNoiseInjectFwd",
    "fkjax_noise_inject_bwd": "FkjaxNoiseInjectBwd",
}


class OneDnnUnavailable(RuntimeError):
  """fkjax's oneDNN convolutions cannot be built or loaded here."""


def onednn_root() -> pathlib.Path:
  return pathlib.Path(environment.text("FKJAX_ONEDNN_ROOT") or sys.prefix)


def cache_dir() -> pathlib.Path:
  default = pathlib.Path("~/.cache/fkjax/onednn").expanduser()
  return pathlib.Path(environment.text("FKJAX_ONEDNN_CACHE") or default)


def _library_path(root: pathlib.Path, compiler: str) -> pathlib.Path:
  digest = hashlib.sha256()
  for part in (*(source.read_bytes() for source in SOURCES),
               jaxlib.__version__.encode(), str(root.resolve()).encode(),
               compiler.encode(),
               (root / "include/oneapi/dnnl/dnnl_version.h").read_bytes()):
    digest.update(part)
  return cache_dir() / f"fkjax_cpu_{digest.hexdigest()[:16]}.so"


def build() -> pathlib.Path:
  """Compiles the library unless the cache has it; returns its path."""
  root = onednn_root()
  header = root / "include/oneapi/dnnl/dnnl.hpp"
  lib_dir = root / "lib"
  if not header.exists() or not any(lib_dir.glob("libdnnl.so*")):
    raise OneDnnUnavailable(
        f"no oneDNN under {root} (looked for {header} and {lib_dir}/libdnnl.so):"
        " pip install onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0"
        " (fkjax's [cpu] extra), or point FKJAX_ONEDNN_ROOT at an install")
  compiler = os.environ.get("CXX", "c++")
  if shutil.which(compiler) is None:
    raise OneDnnUnavailable(f"no C++ compiler {compiler!r} on PATH (set CXX)")
  target = _library_path(root, compiler)
  if _is_intact(target):
    return target
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target, then replace it whole: concurrent processes
    # never load a half-written library.
    build_dir = tempfile.mkdtemp(dir=target.parent, prefix=".build.")
  except OSError as e:
    raise OneDnnUnavailable(f"cannot write to {target.parent} (set "
                            f"FKJAX_ONEDNN_CACHE): {e}") from e
  tmp = os.path.join(build_dir, target.name)
  # -fopenmp: the noise kernel's loops (libgomp is oneDNN's runtime too);
  # -fno-math-errno and -fno-trapping-math let its square roots and selects
  # vectorise.
  command = [compiler, "-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp",
             "-fno-math-errno", "-fno-trapping-math", "-Wno-attributes",
             "-Wno-return-type",
             f"-I{jax.ffi.include_dir()}", f"-I{root / 'include'}",
             *map(str, SOURCES), "-o", tmp, f"-L{lib_dir}", "-ldnnl",
             f"-Wl,-rpath,{lib_dir.resolve()}"]
  try:
    result = subprocess.run(command, capture_output=True, text=True,
                            check=False)
    if result.returncode:
      raise OneDnnUnavailable("compiling fkjax's oneDNN convolutions failed:\n"
                              + " ".join(command) + "\n" + result.stderr[-4000:])
    try:
      library = pathlib.Path(tmp).read_bytes()
      atomic.write_bytes(target, library)
      # The digest last: a library without its (matching) digest is rebuilt.
      atomic.write_text(_digest_path(target),
                        hashlib.sha256(library).hexdigest() + "\n")
    except OSError as e:
      raise OneDnnUnavailable(f"cannot write to {target.parent} (set "
                              f"FKJAX_ONEDNN_CACHE): {e}") from e
  finally:
    shutil.rmtree(build_dir, ignore_errors=True)
  return target


def _digest_path(library: pathlib.Path) -> pathlib.Path:
  return library.with_name(library.name + ".sha256")


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _is_intact(library: pathlib.Path) -> bool:
  """Whether ``library`` exists with the digest recorded when it was built."""
  try:
    return _digest_path(library).read_text().strip() == _sha256(library)
  except OSError:
    return False


@functools.cache
def load() -> ctypes.CDLL:
  """Builds (once) and loads the library, registering its FFI targets.

  Raises:
    OneDnnUnavailable: no oneDNN, no compiler, or the build failed.
  """
  try:
    library = ctypes.CDLL(str(build()))
  except OSError as e:
    raise OneDnnUnavailable(f"loading fkjax's oneDNN library failed: {e}") from e
  for name, symbol in TARGETS.items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)),
                                platform="cpu")
  return library


@functools.cache
def unavailable_reason() -> str | None:
  """None when :func:`load` works here, else why it does not (asked once)."""
  try:
    load()
  except OneDnnUnavailable as e:
    return str(e)
  return None
