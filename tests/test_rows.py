"""The one row store (allreduce_jax.results): keys, torn lines, foreign files."""

import json
import threading

import pytest

from allreduce_jax.results import SCHEMA, RowsError, RowStore, load_json, read_rows, save_json


def _store(tmp_path, name="rows.jsonl", kind="bench", **context):
  return RowStore(tmp_path / name, kind, context=context or {"iters": 10})


def test_rows_carry_schema_kind_and_key_and_resume_by_key(tmp_path):
  store = _store(tmp_path)
  key = store.key(algorithm="ring", bytes=1024)
  stored = store.append({"algorithm": "ring", "bytes": 1024, "time_us": 5.0}, key)
  assert (stored["schema"], stored["kind"], stored["key"]) == (SCHEMA, "bench", key)
  line = (tmp_path / "rows.jsonl").read_text()
  assert line.startswith('{"schema": "allreduce-jax/rows/1", "kind": "bench"')
  assert json.loads(key) == {"iters": 10, "algorithm": "ring", "bytes": 1024}
  assert key in store.done()
  # The same row under another configuration is not done.
  other = RowStore(tmp_path / "rows.jsonl", "bench", context={"iters": 20})
  assert other.key(algorithm="ring", bytes=1024) not in other.done()
  assert store.current() == store.rows() and other.current() == []


def test_default_context_has_jax_version_backend_and_process_count(tmp_path, monkeypatch):
  monkeypatch.delenv("ALLREDUCE_JAX_NETWORK", raising=False)
  store = RowStore(tmp_path / "r.jsonl", "bench")
  assert set(store.context) == {"jax_version", "backend", "process_count"}


def test_rows_on_an_emulated_cluster_carry_its_network_and_keep_apart(tmp_path, monkeypatch):
  # allreduce-jax cluster describes its network to every host in this variable.
  net = {"network": "switch", "hosts": 4, "link_Bps": 25e6, "queue_s": 0.1, "mtu": 1500}
  monkeypatch.setenv("ALLREDUCE_JAX_NETWORK", json.dumps({**net, "tcp_queue": 16384}))
  small = RowStore(tmp_path / "r.jsonl", "bench")
  key = small.key(algorithm="ring")
  small.append({"algorithm": "ring"}, key)
  assert json.loads(key)["network"]["tcp_queue"] == 16384
  monkeypatch.setenv("ALLREDUCE_JAX_NETWORK", json.dumps({**net, "tcp_queue": 4 << 20}))
  deep = RowStore(tmp_path / "r.jsonl", "bench")
  assert deep.key(algorithm="ring") not in deep.done() and deep.current() == []
  monkeypatch.setenv("ALLREDUCE_JAX_NETWORK", "switch")
  with pytest.raises(ValueError, match=r"ALLREDUCE_JAX_NETWORK is not JSON"):
    RowStore(tmp_path / "r.jsonl", "bench").key()


def test_torn_last_line_is_skipped_with_a_warning_and_cut_before_the_next_append(tmp_path, capsys):
  store = _store(tmp_path)
  store.append({"n": 1}, store.key(n=1))
  path = tmp_path / "rows.jsonl"
  with open(path, "a") as f:
    f.write('{"schema": "allreduce-jax/rows/1", "kind": "bench", "key": "{\\"n')  # killed
  assert [r["n"] for r in store.rows()] == [1]
  assert "half-written last line" in capsys.readouterr().err
  store.append({"n": 2}, store.key(n=2))
  lines = path.read_text().splitlines()
  assert [json.loads(line)["n"] for line in lines] == [1, 2]  # no glued line
  assert path.read_text().endswith("\n")


def test_a_torn_first_write_is_ours(tmp_path):
  path = tmp_path / "rows.jsonl"
  path.write_text('{"schema": "allreduce-jax/ro')
  store = _store(tmp_path)
  assert store.rows() == []
  store.append({"n": 1}, store.key(n=1))
  assert len(path.read_text().splitlines()) == 1


@pytest.mark.parametrize(
  "content, message",
  [
    ('{"a": 1}\n', "line 1 is not an allreduce-jax row"),
    ("[1, 2]\n", "line 1 is not an allreduce-jax row"),
    ("algorithm,time\nring,3\n", "line 1 is not JSON"),
    ("my notes", "is not an allreduce-jax row file"),
  ],
)
def test_foreign_content_is_refused_naming_the_file(tmp_path, content, message):
  path = tmp_path / "rows.jsonl"
  path.write_text(content)
  store = _store(tmp_path)
  for action in (store.rows, store.check, store.reset, lambda: store.append({"n": 1}, "k")):
    with pytest.raises(RowsError, match=message) as e:
      action()
    assert str(path) in str(e.value) and "\n" not in str(e.value)
  assert path.read_text() == content  # untouched, not deleted


def test_a_stray_json_line_among_rows_is_refused(tmp_path):
  store = _store(tmp_path)
  store.append({"n": 1}, store.key(n=1))
  with open(tmp_path / "rows.jsonl", "a") as f:
    f.write('{"n": 2}\n')
  with pytest.raises(RowsError, match="line 2 is not an allreduce-jax row"):
    store.done()


def test_rows_of_another_kind_are_refused(tmp_path):
  _store(tmp_path, kind="fusion").append({"n": 1}, "k")
  with pytest.raises(RowsError, match="holds 'fusion' rows, not 'bench' rows"):
    _store(tmp_path).check()


def test_only_jsonl_paths(tmp_path):
  notes = tmp_path / "notes.csv"
  notes.write_text("a,b\n1,2\n")
  store = RowStore(notes, "bench", context={})
  with pytest.raises(RowsError, match=r"notes.csv: rows are written to .jsonl files only"):
    store.reset()
  assert notes.read_text() == "a,b\n1,2\n"


def test_check_finds_an_unwritable_path_before_work(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  with pytest.raises(RowsError, match="cannot create its folder"):
    RowStore(blocker / "sub" / "rows.jsonl", "bench", context={}).check()
  store = _store(tmp_path)
  store.check()
  assert not (tmp_path / "rows.jsonl").exists()  # checking leaves nothing behind


def test_reset_empties_only_our_file(tmp_path):
  store = _store(tmp_path)
  store.append({"n": 1}, "k")
  store.reset()
  assert (tmp_path / "rows.jsonl").read_bytes() == b""  # emptied in place (a lock stays valid)
  (tmp_path / "rows.jsonl").unlink()
  store.reset()  # absent: nothing to do
  assert not (tmp_path / "rows.jsonl").exists()


def test_read_rows_and_extend(tmp_path):
  store = _store(tmp_path)
  store.extend([{"n": 1}, {"n": 2}], ["a", "b"])
  assert [r["n"] for r in read_rows(tmp_path / "rows.jsonl", "bench")] == [1, 2]
  assert read_rows(tmp_path / "none.jsonl", "bench") == []
  with pytest.raises(ValueError, match="key"):
    store.append({"n": 3})
  # by: each row keyed by those of the named fields it has, as store.key of them would
  rows = [{"n": 4, "what": "add"}, {"n": 5, "what": "trace", "rep": 1}]
  stored = store.extend(rows, by=("what", "rep", "absent"))
  assert [r["key"] for r in stored] == [store.key(what="add"), store.key(what="trace", rep=1)]


def test_state_json_is_atomic_and_a_truncated_one_is_ignored(tmp_path, capsys):
  path = tmp_path / "sections.json"
  save_json(path, {"a": {"status": 0}})
  assert load_json(path) == {"a": {"status": 0}}
  path.write_text('{"a": {"sta')  # truncated by an older, non-atomic writer
  assert load_json(path, {}) == {}
  assert "sections.json" in capsys.readouterr().err
  assert load_json(tmp_path / "missing.json", {}) == {}


def test_concurrent_checks_never_remove_the_writers_file(tmp_path):
  # Every process of a multi-process bench checks the same --out path while process 0
  # creates and locks it (a 2-host cluster bench failed with "No such file" when one
  # process's check removed the file another had just created).
  path = tmp_path / "rows.jsonl"
  errors: list[BaseException] = []

  def checker():
    try:
      for _ in range(3000):
        RowStore(path, "bench", context={}).check()
    except BaseException as e:  # reported below
      errors.append(e)

  threads = [threading.Thread(target=checker) for _ in range(3)]
  for t in threads:
    t.start()
  writer = RowStore(path, "bench", context={})
  lost = 0
  for _ in range(2000):
    writer.lock()  # creates the file
    lost += not path.exists()
    writer.unlock()  # nothing written: removes it again
  for t in threads:
    t.join()
  assert errors == [] and lost == 0
  assert list(tmp_path.iterdir()) == []  # no probe, no empty file left behind
