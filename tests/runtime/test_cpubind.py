"""The machine-wide registry of bound CPUs (runtime/node/cpubind.py ``SharedLoad``)
with real files: what one node process publishes the others read, however
quickly it changes, and nothing is left of a process that is gone."""

from __future__ import annotations

import os

from pydvm.runtime.node.cpubind import SharedLoad


def _load(tmp_path, monkeypatch, tag):
    monkeypatch.setenv("PYDVM_CPULOAD_DIR", str(tmp_path))
    return SharedLoad(tag)


def test_what_one_publishes_the_others_read_at_once(tmp_path, monkeypatch):
    a, b = _load(tmp_path, monkeypatch, "a"), _load(tmp_path, monkeypatch, "b")
    assert b.others() == {}              # listed: nobody yet
    with a.locked():
        a.publish({0: 2, 1: 1})          # a's entry appears right after b's listing
    assert b.others() == {0: 2, 1: 1}
    for counts in ({0: 1}, {}, {1: 3}):  # rewritten in place, read every time
        with a.locked():
            a.publish(counts)
        assert b.others() == counts
    assert a.others() == {}              # a's own entry is not counted
    a.close()
    assert b.others() == {} and sorted(os.listdir(tmp_path)) == [".lock"]


def test_an_entry_of_a_process_that_is_gone_is_removed(tmp_path, monkeypatch):
    b = _load(tmp_path, monkeypatch, "b")
    assert b.others() == {}
    dead = 2 ** 22 + 12345               # above the kernel's pid limit: never alive
    (tmp_path / f"{dead}-x").write_text('{"0": 5}')
    assert b.others() == {}
    assert not (tmp_path / f"{dead}-x").exists()


def test_a_node_that_never_bound_anything_has_no_entry(tmp_path, monkeypatch):
    a = _load(tmp_path, monkeypatch, "a")
    with a.locked():
        a.publish({})
    assert [n for n in os.listdir(tmp_path) if not n.startswith(".")] == []
    a.close()
