"""fkjax.atomic (whole files or none) and fkjax.config.keys (dotted keys)."""
import json
import os

import ml_collections
import pytest

from fkjax import atomic
from fkjax.config import keys as config_keys


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "sub" / "r.json"
  atomic.write_json(path, {"b": 1, "a": [1.5]}, sort_keys=True)
  atomic.write_json(path, {"c": 2})
  assert json.loads(path.read_text()) == {"c": 2}
  assert path.read_text().endswith("\n")
  assert os.listdir(path.parent) == ["r.json"]
  atomic.write_bytes(tmp_path / "b.bin", b"\x00\x01")
  assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
  path = tmp_path / "r.txt"
  atomic.write_text(path, "old")
  with pytest.raises(RuntimeError):
    with atomic.replacing(path) as f:
      f.write("half of the new")
      raise RuntimeError("killed")
  assert path.read_text() == "old"
  assert os.listdir(tmp_path) == ["r.txt"]
  with pytest.raises(TypeError):  # not JSON: nothing written
    atomic.write_json(path, {"x": object()})
  assert path.read_text() == "old"
  with pytest.raises(ValueError, match="mode"):
    with atomic.replacing(path, "a"):
      pass


def _config():
  c = ml_collections.ConfigDict()
  c.training = ml_collections.ConfigDict({"batch_size": 128, "none": None})
  return c


def test_dotted_get_and_has():
  c = _config()
  assert config_keys.get(c, "training.batch_size") == 128
  assert config_keys.get(c, "training.none", 5) is None
  assert config_keys.get(c, "training.missing", 5) == 5
  assert config_keys.get(c, "training.batch_size.deeper", 7) == 7
  assert config_keys.get(c.to_dict(), "training.batch_size") == 128
  assert config_keys.has(c, "training") and config_keys.has(c, "training.none")
  assert not config_keys.has(c, "model.depth")


def test_dotted_set_creates_or_refuses_new_keys():
  c = _config()
  config_keys.set_value(c, "training.batch_size", "any type")
  assert c.training.batch_size == "any type"
  config_keys.set_value(c, "model.depth", 8)
  assert c.model.depth == 8
  with pytest.raises(KeyError, match="no key 'training.batch'"):
    config_keys.set_value(c, "training.batch", 1, must_exist=True)
  with pytest.raises(KeyError, match="no section 'data'"):
    config_keys.set_value(c, "data.name", 1, must_exist=True)
  assert "batch" not in c.training and "data" not in c


@pytest.mark.parametrize("value", [
    3, 0.5, None, "text", (1, 2), [1, 2], {"inner": 1},
    ml_collections.FieldReference(None, field_type=int),
    ml_collections.FieldReference({"inner": 1}),
    ml_collections.ConfigDict({"inner": 1})],
    ids=["int", "float", "none", "str", "tuple", "list", "dict",
         "reference_to_none", "reference_to_dict", "configdict"])
def test_a_new_leaf_is_stored_as_ignore_type_stores_it(value):
  # set_value skips ignore_type() for a new leaf where that changes nothing
  # (its walk made a whole config cost ~40 ms): the stored field, its type
  # and, for a dict made a ConfigDict, that child's type safety all match.
  fast, slow = _config(), _config()
  config_keys.set_value(fast, "training.new", value)
  with slow.training.ignore_type():
    slow.training["new"] = value
  got, want = fast.training.new, slow.training.new
  assert type(got) is type(want) and got == want
  if isinstance(want, ml_collections.ConfigDict):
    assert got.is_type_safe == want.is_type_safe
