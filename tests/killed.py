"""A process 'killed' part-way through its batches, for resume tests."""


class Killed(Exception):
  """Stands for the kill: raised where the next batch would be read."""


def killed_after(batches, n):
  """The batches, with the process 'killed' when the (n+1)-th is read."""
  for i, batch in enumerate(batches):
    if i == n:
      raise Killed
    yield batch
