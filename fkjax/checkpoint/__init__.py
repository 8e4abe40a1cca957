"""Orbax checkpoints: the latest states (to resume) and the best one, verified.

All checkpoints live in ``<workdir>/checkpoints/<step>/``, managed by one
orbax ``CheckpointManager`` whose preservation policy keeps

* the latest ``KEEP_LATEST`` (2) checkpoints, whatever they are, and
* the one with the highest validation accuracy among the end-of-epoch
  checkpoints (``save(..., val_accuracy=...)``). Mid-epoch checkpoints carry
  no metric: they never count as, nor displace, the best one.

One save per epoch writes both roles, so no crash can leave "latest" and
"best" out of step. Orbax writes each checkpoint into a temporary directory
and renames it when complete: a process killed during a save (even
``kill -9``) leaves the previous checkpoints intact; the partial directory
(``*.orbax-checkpoint-tmp*``) is removed the next time training opens the
workdir. ``Checkpointer(workdir, asynchronous=True)`` (``train.py``'s)
returns from ``save`` once the arrays are on the host and writes the files
on orbax's threads; the next ``save``, ``wait`` or ``close`` waits for that
write and raises its failure in one line.

Every checkpoint records a SHA-256 digest of each array; ``restore``
recomputes them and checks that floating-point values are finite, so bytes
damaged on disk raise ``CheckpointError`` instead of restoring garbage. A
checkpoint whose digests cannot be read (its metadata file deleted, not
JSON, or holding none) cannot be verified and is refused, saying which,
unless the caller allows it (``allow_unverified=True``; on the command line
``--allow_unverified_checkpoint`` or ``FKJAX_ALLOW_UNVERIFIED_CHECKPOINT=1``):
anyone who can rewrite the arrays can delete their digests too.

* :mod:`~fkjax.checkpoint.manager`: ``Checkpointer`` (orbax's manager and
  its options), ``require_checkpoints``, ``has_checkpoints``.
* :mod:`~fkjax.checkpoint.digests`: the arrays' digests, saved and compared;
  the non-finite check.
* :mod:`~fkjax.checkpoint.shapes`: the checkpoint's arrays against the
  config's, in words.
* :mod:`~fkjax.checkpoint.errors`: ``CheckpointError``; orbax's I/O and
  restore failures in one line.
* :mod:`~fkjax.checkpoint.quiet`: orbax's log lines and leftover reports
  dropped where fkjax says the same in one line.
"""
from fkjax.checkpoint.errors import CheckpointError
from fkjax.checkpoint.manager import ALLOW_UNVERIFIED_ENV
from fkjax.checkpoint.manager import ALLOW_UNVERIFIED_FLAG
from fkjax.checkpoint.manager import KEEP_LATEST
from fkjax.checkpoint.manager import Checkpointer
from fkjax.checkpoint.manager import has_checkpoints
from fkjax.checkpoint.manager import require_checkpoints

__all__ = [
    "ALLOW_UNVERIFIED_ENV", "ALLOW_UNVERIFIED_FLAG", "KEEP_LATEST",
    "CheckpointError", "Checkpointer", "has_checkpoints",
    "require_checkpoints",
]
