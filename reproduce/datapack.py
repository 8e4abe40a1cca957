"""CIFAR-10's binary release in a few compressed parts, for a lent machine.

A lent GPU is sent at most 64 MiB a call (the working tree included) and
reaches no network, while the binary release is 184 MB (163 MB as the
official tar.gz). This packs it losslessly into parts that each fit a
call, to be staged in a folder that persists while the machine stays warm
(``benchmarks/gpu_reproduce.sh``, docs/reproduction.md)::

  python -m reproduce.datapack pack $FKJAX_DATA_DIR .datapack_all --part-mib=40
  python -m reproduce.datapack unpack STAGE DEST   # on the machine

Each image file is split into its label bytes and its pixel planes (the
release stores an image as 1 label byte then 1024 red, 1024 green, 1024
blue bytes), and the pixels are xz-compressed through xz's delta filter
(each byte stored as its difference from its left neighbour, which
neighbouring pixels make small; ``pack`` prints what it saves).
``unpack`` checks every part and every file's SHA-256 before it writes the
release, and exits 1 naming the parts still missing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import sys

import numpy as np

from fkjax import atomic

MANIFEST = "cifar10.json"
PART = "cifar10.xz.part-{:02d}"
RECORD = 1 + 3 * 32 * 32
FOLDER = "cifar-10-batches-bin"
_FILTERS = [{"id": lzma.FILTER_DELTA, "dist": 1},
            {"id": lzma.FILTER_LZMA2, "preset": 6}]


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _split(raw: bytes) -> bytes:
  """Labels first, then every image's pixel planes: deltas stay within
  images' rows (but at row starts) instead of jumping at each label."""
  records = np.frombuffer(raw, np.uint8).reshape(-1, RECORD)
  return records[:, 0].tobytes() + records[:, 1:].tobytes()


def _join(data: bytes, n: int) -> bytes:
  flat = np.frombuffer(data, np.uint8)
  records = np.empty((n, RECORD), np.uint8)
  records[:, 0] = flat[:n]
  records[:, 1:] = flat[n:].reshape(n, RECORD - 1)
  return records.tobytes()


def pack(source: str, out: str, part_bytes: int) -> dict:
  """Packs the release in ``source`` (the folder holding
  ``cifar-10-batches-bin``, or that folder) into parts in ``out``."""
  folder = source if os.path.basename(source.rstrip("/")) == FOLDER else (
      os.path.join(source, FOLDER))
  names = sorted(n for n in os.listdir(folder)
                 if os.path.isfile(os.path.join(folder, n)))
  entries, stream = [], []
  for name in names:
    with open(os.path.join(folder, name), "rb") as f:
      raw = f.read()
    images = name.endswith(".bin") and len(raw) % RECORD == 0
    entries.append({"name": name, "bytes": len(raw), "sha256": _sha(raw),
                    "images": len(raw) // RECORD if images else 0})
    stream.append(_split(raw) if images else raw)
  blob = lzma.compress(b"".join(stream), format=lzma.FORMAT_XZ,
                       filters=_FILTERS)
  os.makedirs(out, exist_ok=True)
  parts = []
  for i in range(0, len(blob), part_bytes):
    chunk = blob[i:i + part_bytes]
    name = PART.format(i // part_bytes)
    atomic.write_bytes(os.path.join(out, name), chunk)
    parts.append({"name": name, "bytes": len(chunk), "sha256": _sha(chunk)})
  manifest = {"files": entries, "parts": parts,
              "raw_bytes": sum(e["bytes"] for e in entries),
              "packed_bytes": len(blob)}
  atomic.write_text(os.path.join(out, MANIFEST),
                    json.dumps(manifest, indent=1))
  return manifest


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


def unpack(stage: str, dest: str) -> str:
  """Writes the release packed in ``stage`` to ``dest/cifar-10-batches-bin``
  (checked file by file); returns that folder.

  Raises:
    ValueError: parts missing or damaged.
  """
  if not os.path.exists(os.path.join(stage, MANIFEST)):
    raise ValueError(f"no {MANIFEST} in {stage}: carry it with a part")
  missing = missing_parts(stage)
  with open(os.path.join(stage, MANIFEST)) as f:
    manifest = json.load(f)
  if missing:
    have = len(manifest["parts"]) - len(missing)
    raise ValueError(f"{have} of {len(manifest['parts'])} parts staged in "
                     f"{stage}; missing: {', '.join(missing)}")
  blob = b""
  for part in manifest["parts"]:
    with open(os.path.join(stage, part["name"]), "rb") as f:
      chunk = f.read()
    if _sha(chunk) != part["sha256"]:
      raise ValueError(f"{part['name']} in {stage} is damaged (sha256)")
    blob += chunk
  data = lzma.decompress(blob, format=lzma.FORMAT_XZ)
  folder = os.path.join(dest, FOLDER)
  os.makedirs(folder, exist_ok=True)
  offset = 0
  for entry in manifest["files"]:
    chunk = data[offset:offset + entry["bytes"]]
    offset += entry["bytes"]
    raw = _join(chunk, entry["images"]) if entry["images"] else chunk
    if _sha(raw) != entry["sha256"]:
      raise ValueError(f"{entry['name']} does not unpack to the packed "
                       "file (sha256)")
    atomic.write_bytes(os.path.join(folder, entry["name"]), raw)
  return folder


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m reproduce.datapack",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("action", choices=("pack", "unpack"))
  p.add_argument("source", help="pack: the data folder; unpack: the stage")
  p.add_argument("dest", help="pack: the parts' folder; unpack: the data "
                              "folder to write")
  p.add_argument("--part-mib", type=float, default=40.0)
  args = p.parse_args(argv)
  try:
    if args.action == "pack":
      m = pack(args.source, args.dest, int(args.part_mib * (1 << 20)))
      print(f"{m['raw_bytes']:,} bytes -> {m['packed_bytes']:,} in "
            f"{len(m['parts'])} part(s) in {args.dest}")
    else:
      print(f"CIFAR-10 written to {unpack(args.source, args.dest)}")
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
