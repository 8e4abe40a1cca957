"""Tests of the CIFAR download, served from 127.0.0.1 (no internet).

The served archives are small CIFAR binary releases built here; their md5 is
put in `fetch.ARCHIVES` for the test (the official md5 would not match).
"""
from __future__ import annotations

import hashlib
import http.server
import io
import os
import pathlib
import socket
import subprocess
import sys
import tarfile
import threading
import urllib.request

import numpy as np
import pytest

from fkjax import data
from fkjax.data import download as download_cli
from fkjax.data import fetch
from tests.subprocess_env import TIMEOUT_S

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _release(rng, name):
  """(archive bytes, {file: (images, labels)}) of a tiny binary release."""
  if name == "cifar10":
    folder, sizes, label_classes = "cifar-10-batches-bin", {
        **{f"data_batch_{i}.bin": 2 for i in range(1, 6)},
        "test_batch.bin": 3}, (10,)
    meta = {"batches.meta.txt": "\n".join(f"c{i}" for i in range(10))}
  else:
    folder, sizes, label_classes = "cifar-100-binary", {
        "train.bin": 6, "test.bin": 3}, (20, 100)
    meta = {}
  members, content = {}, {}
  for f, n in sizes.items():
    images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    labels = np.stack([rng.integers(0, k, n) for k in label_classes], 1)
    # Label bytes, then the R, G, B planes, each row-major.
    planes = images.transpose(0, 3, 1, 2).reshape(n, -1)
    members[f] = np.concatenate([labels.astype(np.uint8), planes], 1).tobytes()
    content[f] = (images, labels[:, -1])
  members.update({f: text.encode() for f, text in meta.items()})
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for f, blob in members.items():
      info = tarfile.TarInfo(f"{folder}/{f}")
      info.size = len(blob)
      tar.addfile(info, io.BytesIO(blob))
  return buf.getvalue(), content


def _md5(blob):
  return hashlib.md5(blob).hexdigest()


class _Served:
  """What the local server holds and how it misbehaves."""

  def __init__(self):
    self.files = {}        # file name -> bytes
    self.cut = False       # send half the body, then close the connection
    self.send_length = True
    self.requests = []
    self.url = ""


@pytest.fixture
def served(monkeypatch):
  state = _Served()

  class Handler(http.server.BaseHTTPRequestHandler):

    def do_GET(self):  # pylint: disable=invalid-name
      state.requests.append(self.path)
      body = state.files.get(self.path.rsplit("/", 1)[-1])
      if body is None:
        self.send_error(404)
        return
      self.send_response(200)
      if state.send_length:
        self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      # HTTP/1.0: the connection closes when this returns, so a cut body
      # reaches the client as an early end of stream.
      self.wfile.write(body[:len(body) // 2] if state.cut else body)

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  thread = threading.Thread(target=server.serve_forever,
                            kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  state.url = f"http://127.0.0.1:{server.server_address[1]}/~kriz/"
  # A proxy from the environment must not see 127.0.0.1.
  monkeypatch.setenv("no_proxy", "*")
  monkeypatch.setenv(fetch.BASE_URL_ENV, state.url)
  yield state
  server.shutdown()
  server.server_close()
  thread.join(timeout=5)


@pytest.fixture
def env(tmp_path, monkeypatch):
  """No $FKJAX_DATA_DIR; the default data dir under tmp_path/cache."""
  monkeypatch.delenv(fetch.DATA_DIR_ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  return tmp_path / "cache" / "fkjax" / "data"


def _serve(served, monkeypatch, name, seed=0):
  blob, content = _release(np.random.default_rng(seed), name)
  archive = fetch.ARCHIVES[name]
  served.files[archive.filename] = blob
  monkeypatch.setitem(fetch.ARCHIVES, name, archive._replace(md5=_md5(blob)))
  return blob, content


def _no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError(f"network access attempted: {args}")
  monkeypatch.setattr(urllib.request, "urlopen", refuse)


def test_default_data_dir_follows_xdg_and_home(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
  assert data.default_data_dir() == str(tmp_path / "x" / "fkjax" / "data")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert data.default_data_dir() == str(
      tmp_path / "home" / ".cache" / "fkjax" / "data")


def test_missing_data_are_downloaded_then_loaded(served, env, monkeypatch,
                                                 capfd):
  blob, content = _serve(served, monkeypatch, "cifar10")
  ds = data.load_dataset("cifar10", val_size=2, strict_sizes=False)

  archive = env / "cifar-10-binary.tar.gz"
  assert archive.read_bytes() == blob
  assert sorted(os.listdir(env)) == ["cifar-10-binary.tar.gz"]
  assert served.requests == ["/~kriz/cifar-10-binary.tar.gz"]
  err = capfd.readouterr().err
  # One line saying what comes from where to where, then progress lines.
  assert (f"CIFAR-10 not found in {env}; downloading "
          f"{served.url}cifar-10-binary.tar.gz to {archive} (162 MiB;") in err
  assert f"cifar-10-binary.tar.gz: {len(blob) / 2**20:.1f} of" in err
  assert "(100%)" in err
  np.testing.assert_array_equal(ds.test.images, content["test_batch.bin"][0])
  np.testing.assert_array_equal(ds.test.labels, content["test_batch.bin"][1])
  assert ds.train.num_examples + ds.val.num_examples == 10
  assert ds.class_names == tuple(f"c{i}" for i in range(10))

  data.load_dataset("cifar10", val_size=2, strict_sizes=False)
  assert len(served.requests) == 1  # present now: not fetched again


def test_wrong_md5_is_an_error_and_keeps_nothing(served, env, monkeypatch):
  blob, _ = _release(np.random.default_rng(0), "cifar10")
  served.files["cifar-10-binary.tar.gz"] = blob  # official md5 expected
  with pytest.raises(data.DataError, match=(
      r"md5 of the [\d,]+ bytes received is [0-9a-f]{32}, expected "
      r"c32a1d4ab5d03f1284b67883e8d87530; nothing was kept")):
    data.load_dataset("cifar10", val_size=2, strict_sizes=False)
  assert os.listdir(env) == []
  with pytest.raises(data.DataError, match="downloading is off"):
    data.load_dataset("cifar10", val_size=2, strict_sizes=False,
                      download=False)


@pytest.mark.parametrize("send_length", [True, False])
def test_interrupted_download_keeps_nothing_and_a_retry_works(
    served, env, monkeypatch, send_length):
  blob, content = _serve(served, monkeypatch, "cifar10")
  served.cut, served.send_length = True, send_length
  # With a Content-Length the short body is named; without one, the md5 of
  # the half received catches it.
  expected = (rf"cut short: received {len(blob) // 2:,} of {len(blob):,} bytes"
              if send_length else r"md5 of the [\d,]+ bytes received")
  with pytest.raises(data.DataError, match=expected):
    data.download_cifar("cifar10", timeout=60)
  assert os.listdir(env) == []
  with pytest.raises(data.DataError, match="downloading is off"):
    data.ensure_cifar("cifar10", download=False)

  served.cut = False
  assert data.ensure_cifar("cifar10", timeout=60) == (
      "archive", str(env / "cifar-10-binary.tar.gz"))
  assert sorted(os.listdir(env)) == ["cifar-10-binary.tar.gz"]
  got = data.read_cifar_binary(env, strict_sizes=False)
  np.testing.assert_array_equal(got.test.images, content["test_batch.bin"][0])


def _closed_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("where", ["missing_file", "no_server"])
def test_unreachable_archive_is_a_clear_error(served, env, monkeypatch,
                                              where):
  base = (served.url if where == "missing_file" else
          f"http://127.0.0.1:{_closed_port()}/")
  with pytest.raises(data.DataError) as info:
    data.ensure_cifar("cifar10", base_url=base, timeout=60)
  message = str(info.value)
  assert message.startswith(f"cannot download {base}cifar-10-binary.tar.gz (")
  assert ("HTTP Error 404" in message if where == "missing_file" else
          "refused" in message)
  # Says what to do: the network, or the file by hand, or FKJAX_DATA_DIR.
  assert "c32a1d4ab5d03f1284b67883e8d87530" in message
  assert "FKJAX_DATA_DIR" in message
  assert os.listdir(env) == []


def test_data_dir_setting_wins_without_network(served, env, monkeypatch,
                                               tmp_path):
  given_blob, given = _release(np.random.default_rng(1), "cifar10")
  other_blob, other = _release(np.random.default_rng(2), "cifar10")
  (tmp_path / "given").mkdir()
  (tmp_path / "given" / "cifar-10-binary.tar.gz").write_bytes(given_blob)
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "cifar-10-binary.tar.gz").write_bytes(other_blob)
  _serve(served, monkeypatch, "cifar10")
  _no_network(monkeypatch)
  monkeypatch.setenv(fetch.DATA_DIR_ENV, str(tmp_path / "given"))

  from_env = data.load_dataset("cifar10", val_size=2, strict_sizes=False)
  from_arg = data.load_dataset("cifar10", data_dir=tmp_path / "other",
                               val_size=2, strict_sizes=False)
  np.testing.assert_array_equal(from_env.test.images,
                                given["test_batch.bin"][0])
  np.testing.assert_array_equal(from_arg.test.images,
                                other["test_batch.bin"][0])
  assert served.requests == []
  assert not env.exists()


def test_download_false_names_the_command(env, monkeypatch):
  _no_network(monkeypatch)
  with pytest.raises(data.DataError, match=(
      rf"CIFAR-100 not found in {env} .*python -m fkjax\.data\.download "
      rf"cifar100 --data-dir {env}`")):
    data.load_dataset("cifar100", download=False)
  assert not env.exists()


def test_command_downloads_checks_and_reports(served, env, monkeypatch,
                                              tmp_path, capsys):
  _serve(served, monkeypatch, "cifar10", seed=3)
  _, content100 = _serve(served, monkeypatch, "cifar100", seed=4)
  target = tmp_path / "target"
  argv = ["cifar10", "cifar100", "--data-dir", str(target)]

  assert download_cli.main(argv) == 0
  assert sorted(os.listdir(target)) == ["cifar-10-binary.tar.gz",
                                        "cifar-100-binary.tar.gz"]
  assert "CIFAR-100: " + str(target / "cifar-100-binary.tar.gz") in (
      capsys.readouterr().out)
  ds = data.load_dataset("cifar100", data_dir=target, val_size=2,
                         strict_sizes=False, download=False)
  np.testing.assert_array_equal(ds.test.labels, content100["test.bin"][1])
  assert not env.exists()  # --data-dir, not the default

  # Present and intact: checked, not fetched again.
  assert download_cli.main(argv) == 0
  assert capsys.readouterr().out.count("md5 matches; nothing to do") == 2
  assert len(served.requests) == 2

  # Damaged: one line naming the file and what to do.
  archive = target / "cifar-10-binary.tar.gz"
  archive.write_bytes(archive.read_bytes()[:-1])
  assert download_cli.main(["cifar10", "--data-dir", str(target)]) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"error: {archive}: md5 is ") and err.count("\n") == 1
  assert "delete it and run this command again" in err


def test_command_as_module_fails_in_one_line(tmp_path):
  env = {**os.environ, "PYTHONPATH": str(_ROOT), "no_proxy": "*"}
  env.pop(fetch.DATA_DIR_ENV, None)
  result = subprocess.run(
      [sys.executable, "-W", "error", "-m", "fkjax.data.download", "cifar10",
       "--data-dir", str(tmp_path / "d"), "--timeout", "10",
       "--base-url", f"http://127.0.0.1:{_closed_port()}/"],
      capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False)
  assert result.returncode == 1
  lines = result.stderr.splitlines()
  assert lines[0].startswith("fkjax: downloading CIFAR-10 from http://")
  assert lines[1].startswith("error: cannot download http://127.0.0.1:")
  assert len(lines) == 2 and "Traceback" not in result.stderr
  assert os.listdir(tmp_path / "d") == []


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_command_refuses_a_timeout_that_is_not_positive_seconds(
    timeout, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    download_cli.main(["cifar10", "--data-dir", str(tmp_path),
                       f"--timeout={timeout}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].endswith(
      f"--timeout: {timeout!r} is not a positive number of seconds")
  assert os.listdir(tmp_path) == []
