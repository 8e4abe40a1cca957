"""Whether a batch fits in memory, asked before it is run.

``eval.batch_size=10000`` with IFGSM^20 under a 6 GiB limit was killed by
the kernel after 18 s without a word. A compiled program knows what it will
allocate (XLA's ``memory_analysis()``: its temporaries and outputs; its
arguments are already allocated); :func:`free_bytes` knows what the device
has left (a GPU's allocator limit less what is in use, said with what
that limit is, since another process's share of the card is not in it; on
the CPU the RAM
Linux calls available, and what the cgroup's limit leaves). :func:`check`
compares them before the program runs, and where it does not fit raises
:class:`BatchTooLarge`, a user's error said in one line, naming the
estimate, what is free and the largest batch that fits: found by
compiling the program at the batches it tries, so that the batch suggested
passes this same check when it is run (:func:`largest_that_fits`). What is
free is the least of the device's and, on a CPU, of what Linux calls
available and what the limits of the process's own cgroup leave (v1 or
v2, read from ``/proc/self/cgroup``).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import jax

# Of what is free, what a program may plan to use: XLA's estimate leaves out
# the allocator's fragmentation and the runtime's own buffers.
USABLE = 0.9
# Of that, what a suggested batch may plan to use: it must still pass when
# tried, though what is free moves a little between runs.
SUGGESTION_MARGIN = 0.97
_GIB = 2 ** 30
# What a GPU's free memory means: the share JAX's allocator took for this
# process when it started, which another process on the card does not see.
GPU_SHARE = (
    " to this process: the share of the card JAX's allocator took at its "
    "start (XLA_PYTHON_CLIENT_MEM_FRACTION, 75% unless set, reserved at "
    "once unless XLA_PYTHON_CLIENT_PREALLOCATE=false), less what it holds; "
    "another process on the card (an eval.py beside a train.py) holds its "
    "own share, which this one cannot see: give both "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false, or fractions that add up to at "
    "most 1 (docs/install.md)")


class BatchTooLarge(ValueError):
  """A batch would need more memory than the device has free."""


def _meminfo_available(text: str | None = None) -> int | None:
  """``MemAvailable`` of ``/proc/meminfo`` in bytes."""
  if text is None:
    try:
      with open("/proc/meminfo") as f:
        text = f.read()
    except OSError:
      return None
  for line in text.splitlines():
    if line.startswith("MemAvailable:"):
      return int(line.split()[1]) * 1024
  return None


def _read_int(path: str) -> int | None:
  try:
    with open(path) as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None   # "max": no limit


def _reclaimable(directory: str, key: str) -> int:
  """The page cache the kernel reclaims before it kills (``inactive_file``
  of ``memory.stat``): counted in the usage, not a program's."""
  try:
    with open(os.path.join(directory, "memory.stat")) as f:
      for line in f:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
          return int(value)
  except OSError:
    pass
  return 0


def _own_cgroups(proc: str) -> dict[str, str]:
  """``/proc/self/cgroup``: the process's cgroup path per hierarchy
  (``""`` for v2's unified one, else its controllers, as ``memory``)."""
  out: dict[str, str] = {}
  try:
    with open(os.path.join(proc, "self", "cgroup")) as f:
      lines = f.read().splitlines()
  except OSError:
    return out
  for line in lines:
    parts = line.split(":", 2)
    if len(parts) != 3:
      continue
    _, controllers, path = parts
    if controllers == "":
      out[""] = path
    for controller in controllers.split(","):
      if controller == "memory":
        out["memory"] = path
  return out


def _levels(mount: str, path: str) -> list[str]:
  """The directories of the cgroup ``path`` under ``mount``, from its own
  up to the mount's root: every one's limit applies. (Inside a container
  whose cgroup namespace is not its own, the path names a directory the
  mount does not have: its levels that exist are read.)"""
  parts = [p for p in path.split("/") if p and p != ".."]
  out = []
  for i in range(len(parts), -1, -1):
    directory = os.path.join(mount, *parts[:i])
    if os.path.isdir(directory):
      out.append(directory)
  return out


def _mounts(proc: str, sys_fs: str) -> dict[str, tuple[str, str]]:
  """Where the cgroup hierarchies are mounted, from
  ``/proc/self/mountinfo``: ``""`` (v2) and ``"memory"`` (v1) -> (mount
  point, the cgroup path at the mount's root). Without mountinfo: the usual
  places under ``sys_fs``."""
  found: dict[str, tuple[str, str]] = {}
  try:
    with open(os.path.join(proc, "self", "mountinfo")) as f:
      lines = f.read().splitlines()
  except OSError:
    lines = []
  for line in lines:
    fields = line.split()
    if " - " not in line or len(fields) < 5:
      continue
    after = line.split(" - ", 1)[1].split()
    if len(after) < 3:
      continue
    kind, options = after[0], after[2].split(",")
    root, point = fields[3], fields[4]
    if kind == "cgroup2":
      found.setdefault("", (point, root))
    elif kind == "cgroup" and "memory" in options:
      found.setdefault("memory", (point, root))
  if not lines:
    found = {"": (sys_fs, "/"),
             "memory": (os.path.join(sys_fs, "memory"), "/")}
  return found


def _relative(path: str, root: str) -> str:
  """The cgroup ``path`` under a mount whose root is the cgroup ``root``
  (a container's mount shows its own cgroup as ``/``)."""
  root = root.rstrip("/")
  if root and (path == root or path.startswith(root + "/")):
    return path[len(root):] or "/"
  return path


def _cgroup_free(proc: str = "/proc", sys_fs: str = "/sys/fs/cgroup"
                 ) -> int | None:
  """What the memory limits of this process's own cgroup and its
  ancestors leave (v2, else v1), or None where none is set.

  Read from ``/proc/self/cgroup`` (and where ``/proc/self/mountinfo`` says
  the hierarchies are), not the hierarchy's root: a job scheduler or
  container puts the process in a child cgroup whose limit the root does
  not show.
  """
  own, mounts = _own_cgroups(proc), _mounts(proc, sys_fs)
  layouts = []
  if "" in own and "" in mounts:   # v2: one hierarchy
    layouts.append(("", "memory.max", "memory.current", "inactive_file"))
  if "memory" in own and "memory" in mounts:   # v1: the memory controller's
    layouts.append(("memory", "memory.limit_in_bytes",
                    "memory.usage_in_bytes", "total_inactive_file"))
  for hierarchy, limit, usage, cache in layouts:
    point, root = mounts[hierarchy]
    free = None
    for directory in _levels(point, _relative(own[hierarchy], root)):
      cap = _read_int(os.path.join(directory, limit))
      used = _read_int(os.path.join(directory, usage))
      # v1 says "no limit" with a number near 2**63, v2 with "max".
      if cap is None or used is None or cap >= 2 ** 60:
        continue
      left = max(0, cap - max(0, used - _reclaimable(directory, cache)))
      free = left if free is None else min(free, left)
    if free is not None:
      return free
  return None


def free_bytes(device: Any | None = None) -> tuple[int | None, str]:
  """``(bytes free, where that comes from)`` on ``device`` (default the
  first); None where it cannot be told."""
  device = device or jax.devices()[0]
  if device.platform != "cpu":
    try:
      stats = device.memory_stats() or {}
    except Exception:  # pylint: disable=broad-except
      stats = {}
    if "bytes_limit" in stats:
      return (int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
              f"{device.device_kind} memory free" + (
                  GPU_SHARE if device.platform == "gpu" else ""))
    return None, ""
  found = [(v, why) for v, why in ((_meminfo_available(), "RAM available"),
                                   (_cgroup_free(), "the cgroup's limit"))
           if v is not None]
  if not found:
    return None, ""
  return min(found)


def needed_bytes(compiled: Any) -> int | None:
  """What running ``compiled`` allocates beyond its arguments (None where
  XLA does not say)."""
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if analysis is None:
    return None
  return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes
             - analysis.alias_size_in_bytes)


def largest_fitting(batch: int, need: int, half_need: int | None,
                    budget: int, multiple: int = 1) -> int:
  """The largest batch whose need, linear through ``(batch, need)`` and
  ``(batch // 2, half_need)``, is within ``budget``; a multiple of
  ``multiple`` (0: none fits). An extrapolation: :func:`largest_that_fits`
  checks its guesses."""
  half = batch // 2
  if half_need is None or half < 1 or need <= half_need:
    per_image, fixed = need / batch, 0.0
  else:
    per_image = (need - half_need) / (batch - half)
    fixed = max(0.0, need - per_image * batch)
  fits = int((budget - fixed) // per_image) if budget > fixed else 0
  return max(0, min(batch - 1, fits) // multiple * multiple)


def largest_that_fits(batch: int, need: int,
                      need_at: Callable[[int], int | None], budget: int,
                      multiple: int = 1, tries: int = 6) -> int:
  """The largest batch below ``batch`` (a multiple of ``multiple``) that
  :func:`fits` ``budget`` by ``need_at(b)`` itself (the program compiled
  at ``b``: what :func:`check` reads when that batch is tried), not by an
  extrapolation: XLA's buffers are not linear in the batch (padding,
  another algorithm past a size), and a suggested batch that the check
  then refused sent the user round in circles. Each guess is the line
  through the nearest measured batches that fit and do not (regula falsi);
  0 where none was found to fit within ``tries`` compilations.
  """
  lo, hi = (0, 0), (batch, need)   # (batch, need): fits / does not
  for _ in range(tries):
    if hi[0] - lo[0] <= multiple:
      break
    slope = (hi[1] - lo[1]) / (hi[0] - lo[0]) if lo[0] else hi[1] / hi[0]
    base = lo if lo[0] else (0, 0)
    guess = (base[0] + (budget - base[1]) / slope if slope > 0
             else hi[0] - multiple)
    guess = int(guess) // multiple * multiple
    if guess < multiple:
      # Even the line through the origin, which no program's fixed part
      # lets a smaller batch beat, has none fit: none does.
      break
    guess = min(max(guess, lo[0] + multiple), hi[0] - multiple)
    measured = need_at(guess)
    if measured is None:
      break
    if measured <= budget:
      lo = (guess, measured)
    else:
      hi = (guess, measured)
  return lo[0]


def _gib(n: float) -> str:
  return f"{n / _GIB:.1f} GiB"


def check(compiled: Any, batch: int, what: str, *, batch_key: str,
          at_batch: Callable[[int], Any] | None = None, multiple: int = 1,
          scale: int = 1, free: tuple[int | None, str] | None = None,
          also: str = "") -> None:
  """Raises :class:`BatchTooLarge` where ``compiled`` (``what``, on a batch
  of ``batch`` images) needs more than :data:`USABLE` of the memory free.

  Args:
    compiled: a ``jax.stages.Compiled``.
    batch: its batch size.
    what: what it computes, for the message (``attack ifgsm20``).
    batch_key: the setting that sets ``batch``
      (``config.eval.batch_size``).
    at_batch: compiles the same program at a smaller batch (called only
      when ``batch`` does not fit): the batch suggested is one whose own
      program passes this check (:func:`largest_that_fits`); without it,
      an extrapolation from ``batch`` alone, said as such.
    multiple: batches must be multiples of this (the devices).
    scale: devices sharing the memory, each running its part of the
      program (XLA's estimate is one device's).
    free: ``free_bytes()``'s answer (default: asked now).
    also: another setting that sizes the program, said after the advice
      (``or sweep fewer runs at once``).
  """
  need = needed_bytes(compiled)
  need = None if need is None else need * scale
  available, where = free if free is not None else free_bytes()
  if need is None or available is None:
    return   # nothing to compare: run as before
  budget = int(available * USABLE)
  if need <= budget:
    return
  if at_batch is not None:
    def need_at(b: int) -> int | None:
      n = needed_bytes(at_batch(b))
      return None if n is None else n * scale
    # Checked against a little less than the budget: what is free moves
    # between this run and the next.
    fits = largest_that_fits(batch, need, need_at,
                             int(budget * SUGGESTION_MARGIN), multiple)
    about = ""
  else:
    fits = largest_fitting(batch, need, None,
                           int(budget * SUGGESTION_MARGIN), multiple)
    about = "about "
  advice = (f"the largest batch that fits is {about}{fits}: rerun with "
            f"--{batch_key}={fits}" if fits else
            "no batch fits: free memory, or use a device with more")
  if also:
    advice += f" ({also})"
  raise BatchTooLarge(
      f"{batch_key}={batch}: {what} needs about {_gib(need)} for a batch of "
      f"{batch} images (XLA's estimate) but {_gib(available)} is free "
      f"({where}); {advice}")


def check_host(count: int, bytes_per_item: int, what: str, *,
               batch_key: str, shown: str | None = None,
               advice: Callable[[int], str] | None = None,
               multiple: int = 1,
               free: tuple[int | None, str] | None = None) -> None:
  """Raises :class:`BatchTooLarge` where host arrays of ``count`` items of
  ``bytes_per_item`` each (what a setting sizes before any program is
  compiled: the batches numpy gathers, generated data) need more than
  :data:`USABLE` of the host's free memory (the least of RAM available and
  the process's cgroup limits). The count suggested passes this same
  check: the need is exactly linear.

  Args:
    count: the items the setting asks for.
    bytes_per_item: the host bytes of one.
    what: what they are, for the message (``a batch of test images``).
    batch_key: the setting (``config.eval.batch_size``).
    shown: how the message names the setting's value (default
      ``batch_key=count``).
    advice: the largest count that fits -> what to do (default: rerun
      with ``--batch_key=N``).
    multiple: counts must be multiples of this.
    free: ``(bytes, where)`` free (default: asked now).
  """
  need = count * bytes_per_item
  if free is None:
    found = [(v, why) for v, why in ((_meminfo_available(), "RAM available"),
                                     (_cgroup_free(), "the cgroup's limit"))
             if v is not None]
    free = min(found) if found else (None, "")
  available, where = free
  if available is None:
    return
  budget = int(available * USABLE)
  if need <= budget:
    return
  fits = min(count - 1, int(budget * SUGGESTION_MARGIN) // bytes_per_item)
  fits = fits // multiple * multiple
  if fits <= 0:
    said = "none fits: free memory"
  elif advice is not None:
    said = advice(fits)
  else:
    said = (f"the largest batch that fits is {fits}: rerun with "
            f"--{batch_key}={fits}")
  raise BatchTooLarge(
      f"{shown or f'{batch_key}={count}'}: {what} would take {_gib(need)} "
      f"of host memory but {_gib(available)} is free ({where}); {said}")


# Bytes a host holds per image of a batch it gathers: the uint8 images,
# their float32 copy and, on a CPU, the devices' (plus label and mask).
def _batch_bytes_per_image(image_shape: tuple[int, ...], itemsize: int
                           ) -> int:
  pixels = 1
  for d in image_shape:
    pixels *= int(d)
  return pixels * (itemsize + 4 + 4) + 16


# CIFAR's images, for what is sized before any data are read.
_CIFAR_IMAGE = (32, 32, 3)


def check_synthetic_sizes(sizes: tuple[int, int]) -> None:
  """Refuses ``dataset.synthetic_sizes`` whose images (uint8, made in
  float32 first) the host cannot hold, before they are generated."""
  total = int(sizes[0]) + int(sizes[1])
  check_host(total, _batch_bytes_per_image(_CIFAR_IMAGE, 1),
             f"{total:,} synthetic images",
             batch_key="config.dataset.synthetic_sizes",
             shown=f"config.dataset.synthetic_sizes={tuple(sizes)}",
             advice=lambda n: f"at most {n:,} fit (train pool and test "
             "together)")


def check_host_batches(config: Any, dataset: Any) -> None:
  """Refuses, before the first is gathered, a batch size whose batches the
  host cannot hold: ``eval.batch_size`` (test images), and
  ``validation.batch_size`` (validation images), each padded to its size;
  ``training.batch_size`` is at most the training split (validated)."""
  for key, split, what in (
      ("eval.batch_size", dataset.test, "a batch of test images"),
      ("validation.batch_size", dataset.val, "a batch of validation images")):
    section, name = key.split(".")
    if split is None or not len(split.labels):
      continue
    check_host(int(config[section][name]),
               _batch_bytes_per_image(split.images.shape[1:],
                                      split.images.dtype.itemsize),
               what, batch_key=f"config.{key}")
