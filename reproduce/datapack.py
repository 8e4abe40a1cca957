"""CIFAR-10's binary release in a few compressed parts, for a lent machine.

A lent GPU is sent at most 64 MiB a call (the working tree included) and
reaches no network, while the binary release is 184 MB (163 MB as the
official tar.gz). This packs it losslessly, into parts that each fit one
call beside the working tree, to be staged in a folder that persists while
the machine stays warm (``benchmarks/gpu_reproduce.sh``,
docs/reproduction.md)::

  python -m reproduce.datapack pack $FKJAX_DATA_DIR .datapack
  python -m reproduce.datapack unpack STAGE DEST   # on the machine

Each image file is split into its label bytes and its images, which
:mod:`reproduce.imagecodec` compresses (0.55 of the raw bytes); each file is
its own xz stream, so both ends use every core. By default a part is what a
call leaves beside what travels with it: 64 MiB less the repository's
working tree (tracked and untracked files that git does not ignore) and the
folders named by ``--also`` (the wheels, ``.whl``), less 1 MiB. ``pack``
into a folder that already holds a pack of the same files only cuts its
parts again. ``unpack`` checks every part and every file's SHA-256 before it
writes the release, and exits 1 naming the parts still missing.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import lzma
import os
import subprocess
import sys

import numpy as np

from fkjax import atomic
from reproduce import files
from reproduce import imagecodec

MANIFEST = "cifar10.json"
PART = "cifar10.xz.part-{:02d}"
RECORD = 1 + 3 * 32 * 32
FOLDER = "cifar-10-batches-bin"
CALL_BYTES = 64 << 20   # what the device tool sends a call
SLACK_BYTES = 1 << 20   # the manifest, and files written before the call


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _encode(raw: bytes, images: int) -> bytes:
  if not images:
    return lzma.compress(raw, format=lzma.FORMAT_XZ)
  records = np.frombuffer(raw, np.uint8).reshape(images, RECORD)
  labels = lzma.compress(records[:, 0].tobytes(), format=lzma.FORMAT_XZ)
  pixels = imagecodec.encode(records[:, 1:].reshape(images, 3, 32, 32))
  # xz streams concatenate: one stream for the labels, one for the pixels,
  # told apart by the labels' length
  return len(labels).to_bytes(8, "little") + labels + pixels


def _decode(data: bytes, images: int) -> bytes:
  if not images:
    return lzma.decompress(data, format=lzma.FORMAT_XZ)
  size = int.from_bytes(data[:8], "little")
  records = np.empty((images, RECORD), np.uint8)
  records[:, 0] = np.frombuffer(
      lzma.decompress(data[8:8 + size], format=lzma.FORMAT_XZ), np.uint8)
  records[:, 1:] = imagecodec.decode(data[8 + size:], images).reshape(
      images, RECORD - 1)
  return records.tobytes()


def _folder(source: str) -> str:
  return source if os.path.basename(source.rstrip("/")) == FOLDER else (
      os.path.join(source, FOLDER))


def _blob(stage: str, manifest: dict) -> bytes:
  """The parts of ``manifest`` in ``stage``, joined and checked."""
  missing = missing_parts(stage)
  if missing:
    have = len(manifest["parts"]) - len(missing)
    raise ValueError(f"{have} of {len(manifest['parts'])} parts staged in "
                     f"{stage}; missing: {', '.join(missing)}")
  chunks = []
  for part in manifest["parts"]:
    with open(os.path.join(stage, part["name"]), "rb") as f:
      chunk = f.read()
    if _sha(chunk) != part["sha256"]:
      raise ValueError(f"{part['name']} in {stage} is damaged (sha256)")
    chunks.append(chunk)
  return b"".join(chunks)


def _packed_again(out: str, entries: list[dict]) -> bytes | None:
  """The packed bytes already in ``out`` if they are a whole pack of these
  very files with this codec, else None."""
  old = files.load_json(os.path.join(out, MANIFEST))
  if not old or old.get("codec") != imagecodec.NAME or [
      (e["name"], e["sha256"]) for e in old["files"]] != [
          (e["name"], e["sha256"]) for e in entries]:
    return None
  try:
    blob = _blob(out, old)
  except ValueError:
    return None
  for entry, was in zip(entries, old["files"]):
    entry.update(offset=was["offset"], packed=was["packed"])
  return blob


def pack(source: str, out: str, part_bytes: int,
         workers: int | None = None) -> dict:
  """Packs the release in ``source`` (the folder holding
  ``cifar-10-batches-bin``, or that folder) into parts of at most
  ``part_bytes`` in ``out``; returns the manifest written there."""
  folder = _folder(source)
  names = sorted(n for n in os.listdir(folder)
                 if os.path.isfile(os.path.join(folder, n)))
  raws, entries = [], []
  for name in names:
    with open(os.path.join(folder, name), "rb") as f:
      raw = f.read()
    images = name.endswith(".bin") and len(raw) % RECORD == 0
    raws.append(raw)
    entries.append({"name": name, "bytes": len(raw), "sha256": _sha(raw),
                    "images": len(raw) // RECORD if images else 0})
  blob = _packed_again(out, entries)
  if blob is None:
    # lzma and numpy release the GIL: threads use every core
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      streams = list(pool.map(_encode, raws,
                              [e["images"] for e in entries]))
    offset = 0
    for entry, stream in zip(entries, streams):
      entry.update(offset=offset, packed=len(stream))
      offset += len(stream)
    blob = b"".join(streams)
  os.makedirs(out, exist_ok=True)
  for name in os.listdir(out):
    if name.startswith(PART.split("{")[0]):
      os.remove(os.path.join(out, name))
  parts = []
  for i in range(0, len(blob), part_bytes):
    chunk = blob[i:i + part_bytes]
    name = PART.format(i // part_bytes)
    atomic.write_bytes(os.path.join(out, name), chunk)
    parts.append({"name": name, "bytes": len(chunk), "sha256": _sha(chunk)})
  manifest = {"codec": imagecodec.NAME, "files": entries, "parts": parts,
              "raw_bytes": sum(e["bytes"] for e in entries),
              "packed_bytes": len(blob)}
  atomic.write_text(os.path.join(out, MANIFEST),
                    json.dumps(manifest, indent=1))
  return manifest


def traveling_bytes(repo: str, also: list[str]) -> int:
  """What the device tool sends of ``repo`` besides the data: its tracked
  files and untracked files that git does not ignore, and the paths
  ``also`` (relative to ``repo``)."""
  listing = subprocess.run(
      ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
      cwd=repo, check=False, capture_output=True)
  if listing.returncode:
    raise ValueError(f"{repo} is not a git checkout: pack from the "
                     "repository's root, or give --part-mib")
  listed = listing.stdout.split(b"\0")
  paths = [os.path.join(repo, os.fsdecode(p)) for p in listed if p]
  for extra in also:
    top = os.path.join(repo, extra)
    if os.path.isfile(top):
      paths.append(top)
    for root, _, names in os.walk(top):
      paths.extend(os.path.join(root, n) for n in names)
  return sum(os.lstat(p).st_size for p in paths if os.path.lexists(p))


def fitting_part_bytes(repo: str, also: list[str]) -> int:
  """The largest part a call carries beside what travels with it."""
  room = CALL_BYTES - SLACK_BYTES - traveling_bytes(repo, also)
  if room < (4 << 20):
    raise ValueError(
        f"the working tree of {repo} and {', '.join(also) or 'nothing'} "
        f"leave {room / 2**20:.1f} MiB of a call's 64 MiB: too little for "
        "CIFAR-10's parts")
  return room


def missing_parts(stage: str) -> list[str]:
  """The parts the manifest in ``stage`` names that are not there whole."""
  with open(os.path.join(stage, MANIFEST)) as f:
    manifest = json.load(f)
  missing = []
  for part in manifest["parts"]:
    path = os.path.join(stage, part["name"])
    if not os.path.exists(path) or os.path.getsize(path) != part["bytes"]:
      missing.append(part["name"])
  return missing


def unpack(stage: str, dest: str, workers: int | None = None) -> str:
  """Writes the release packed in ``stage`` to ``dest/cifar-10-batches-bin``
  (checked file by file); returns that folder.

  Raises:
    ValueError: parts missing or damaged, or another codec's pack.
  """
  manifest = files.load_json(os.path.join(stage, MANIFEST))
  if manifest is None:
    raise ValueError(f"no readable {MANIFEST} in {stage}: carry it with a "
                     "part")
  if manifest.get("codec") != imagecodec.NAME:
    raise ValueError(f"{stage} holds a pack of codec "
                     f"{manifest.get('codec', 'xz-delta')!r}, this checkout "
                     f"reads {imagecodec.NAME!r}: pack it again with this "
                     "checkout")
  blob = _blob(stage, manifest)
  folder = os.path.join(dest, FOLDER)
  os.makedirs(folder, exist_ok=True)

  def write(entry: dict) -> None:
    raw = _decode(blob[entry["offset"]:entry["offset"] + entry["packed"]],
                  entry["images"])
    if len(raw) != entry["bytes"] or _sha(raw) != entry["sha256"]:
      raise ValueError(f"{entry['name']} does not unpack to the packed "
                       "file (sha256)")
    atomic.write_bytes(os.path.join(folder, entry["name"]), raw)

  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    list(pool.map(write, manifest["files"]))
  return folder


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m reproduce.datapack",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("action", choices=("pack", "unpack"))
  p.add_argument("source", help="pack: the data folder; unpack: the stage")
  p.add_argument("dest", help="pack: the parts' folder; unpack: the data "
                              "folder to write")
  p.add_argument("--part-mib", type=float, default=None,
                 help="pack: the parts' size (default: what a device call "
                      "leaves beside this repository and --also)")
  p.add_argument("--also", default=".whl",
                 help="pack: comma-separated paths every call carries too "
                      "(default .whl)")
  args = p.parse_args(argv)
  try:
    if args.action == "pack":
      if args.part_mib is not None:
        if args.part_mib <= 0:
          raise ValueError(f"--part-mib={args.part_mib}: must be above 0")
        part_bytes = int(args.part_mib * (1 << 20))
      else:
        part_bytes = fitting_part_bytes(
            os.getcwd(), [a for a in args.also.split(",") if a])
      m = pack(args.source, args.dest, part_bytes)
      print(f"{m['raw_bytes']:,} bytes -> {m['packed_bytes']:,} "
            f"({m['packed_bytes'] / m['raw_bytes']:.3f}) in "
            f"{len(m['parts'])} part(s) of at most "
            f"{part_bytes / 2**20:.1f} MiB in {args.dest}: one a call")
    else:
      print(f"CIFAR-10 written to {unpack(args.source, args.dest)}")
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
