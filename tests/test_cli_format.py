"""Output formats of the command line (pydvm.cli.formatting), as pure functions."""

from __future__ import annotations

import ast
import base64
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from pydvm.cli.formatting import (duration, found_line, job_end_lines, lookup_json, one_shot_warning,
                              ps_lines, quote, store_lines, table, value_text)


@pytest.mark.parametrize("text", ["abc", "tcp://10.0.0.1:5555", "héllo", "a=b", "x'y", "42"])
def test_a_plain_token_prints_exactly_as_it_is(text):
    """SPEC 9: a str value without special characters is printed as is."""
    assert quote(text) == text
    assert found_line("k", text, "ns@1", 0) == f"FOUND k {text} from ns@1:0"


@pytest.mark.parametrize("text,shown", [
    ("a b", '"a b"'), ("x\ny", '"x\\ny"'), ("", '""'), ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'), ("tab\there", '"tab\\there"'),
    ("nb\u00a0sp", '"nb\\u00a0sp"'), ("line\u2028sep", '"line\\u2028sep"'),
])
def test_a_key_that_is_not_one_plain_token_is_quoted_as_a_json_string(text, shown):
    assert quote(text) == shown


@pytest.mark.parametrize("text", ["a b", "", 'say "hi"', "back\\slash", "tcp://h:1 x", "é ü"])
def test_a_printable_str_value_prints_as_is_spaces_and_quotes_included(text):
    """SPEC 9: a str value is printed as is."""
    assert value_text(text) == text
    assert found_line("k", text, "ns@1", 0) == f"FOUND k {text} from ns@1:0"


@pytest.mark.parametrize("text,shown", [
    ("x\ny", '"x\\ny"'), ("tab\there", '"tab\\there"'), ("cr\r", '"cr\\r"'),
    ("line\u2028sep", '"line\\u2028sep"'),
])
def test_a_str_value_with_a_line_break_or_unprintable_character_is_quoted(text, shown):
    """Every FOUND stays one line: such a value prints as a JSON string literal."""
    assert value_text(text) == shown
    assert json.loads(value_text(text)) == text


@given(st.text())
def test_quoted_text_is_one_token_on_one_line_and_reads_back(text):
    """Whatever a str holds, its printed form has no newline and no whitespace outside
    quotes, and json.loads (or the text itself, when plain) gives it back."""
    shown = quote(text)
    assert len(shown.splitlines()) <= 1
    if shown.startswith('"'):
        assert json.loads(shown) == text
        assert all(c == " " or not c.isspace() for c in shown)
    else:
        assert shown == text and not any(c.isspace() for c in shown)


@given(st.one_of(st.binary(), st.integers(-2**63, 2**64 - 1), st.booleans(),
                 st.floats(allow_nan=False, allow_infinity=False)))
def test_non_str_values_print_as_python_literals_on_one_line(value):
    """SPEC 9's repr: one line, and ast.literal_eval reads it back (a non-finite
    float prints as its repr too, `inf` or `nan`, which only --json types)."""
    line = found_line("k", value, "ns@1", 3)
    assert "\n" not in line
    shown = line[len("FOUND k "):-len(" from ns@1:3")]
    assert ast.literal_eval(shown) == value


def test_lookup_json_types_and_base64_bytes():
    found = [SimpleNamespace(key="b", value=b"\x00\xff", nspace="ns@1", rank=2),
             SimpleNamespace(key="i", value=7, nspace="ns@1", rank=0),
             SimpleNamespace(key="t", value=True, nspace="ns@1", rank=0),
             SimpleNamespace(key="f", value=float("inf"), nspace="ns@1", rank=0),
             SimpleNamespace(key="s", value="x y", nspace="ns@1", rank=0)]
    got = lookup_json("PMIX_ERR_PARTIAL_SUCCESS", ["b", "i", "t", "f", "s", "gone"], found)
    json.dumps(got, allow_nan=False)  # valid JSON, nothing JSON cannot hold
    assert got["found"]["b"] == {"value": base64.b64encode(b"\x00\xff").decode(),
                                 "type": "bytes", "publisher": {"nspace": "ns@1", "rank": 2}}
    assert [got["found"][k]["type"] for k in "itfs"] == ["int", "bool", "float", "str"]
    assert got["found"]["f"]["value"] == "inf"
    assert got["missing"] == ["gone"]


def _reply(**kw):
    r = {"nspace": "ns@4", "exit": 6, "failures": [], "failed": 0, "killed": 0, "apps": 1,
         "msg": ""}
    r.update(kw)
    return r


def test_job_end_reports_each_failure_then_the_first_then_who_killed_it():
    r = _reply(failures=[[1, 0, "b", 6, 0], [2, 0, "c", 137, 9]], failed=2)
    assert job_end_lines(r, interrupted=False) == [
        "pydvm run: process [ns@4,1] on node b exited with status 6",
        "pydvm run: process [ns@4,2] on node c was killed by signal SIGKILL (9)",
        "pydvm run: ns@4: 2 of the job's processes failed; the first to fail was [ns@4,1], "
        "so the job exits with status 6",
    ]
    r = _reply(failures=[[0, 0, "a", 4, 0]], failed=1, killed=3,
               msg="aborted because process [ns@4,0] failed (--abort-on-failure)")
    assert job_end_lines(r, interrupted=False)[-1] == (
        "pydvm run: ns@4: aborted because process [ns@4,0] failed (--abort-on-failure); "
        "3 other processes were killed")


def test_job_end_names_apps_only_for_mpmd_jobs_and_caps_the_list():
    r = _reply(failures=[[5, 1, "a", 1, 0]], failed=30, apps=2)
    out = job_end_lines(r, interrupted=False)
    assert out[0] == "pydvm run: process [ns@4,5] (app 1) on node a exited with status 1"
    assert out[1] == "pydvm run: ns@4: ... and 29 more failed processes"


def test_job_end_for_a_plain_kill_counts_the_processes_it_ended():
    r = _reply(killed=2, msg="killed by 'pydvm kill' from uid 7")
    assert job_end_lines(r, interrupted=False) == [
        "pydvm run: ns@4: killed by 'pydvm kill' from uid 7; 2 processes were killed"]


def test_job_end_after_our_own_interrupt_reports_failures_but_not_the_kill():
    r = _reply(killed=2, msg="its pydvm run was interrupted (signal 2)")
    assert job_end_lines(r, interrupted=True) == []
    assert job_end_lines(_reply(), interrupted=False) == []


def test_one_shot_warning_only_for_what_a_persistent_dvm_keeps():
    rows = [{"key": "n", "persistence": "nspace"}, {"key": "tok", "persistence": "first-read"}]
    w = one_shot_warning(rows)
    assert w.startswith("pydvm run: warning: this one-shot DVM ended holding 1 key ")
    assert "tok (first-read)" in w and "n (nspace)" not in w and "\n" not in w
    assert one_shot_warning([{"key": "n", "persistence": "app"}]) is None
    many = [{"key": f"k{i}", "persistence": "indef"} for i in range(8)]
    assert "and 3 more" in one_shot_warning(many)
    assert "holding at least 8 keys" in one_shot_warning(many, truncated=True)


def test_tables_align_columns_and_ps_shows_layout_and_apps():
    assert table(["A", "BB"], [["xyz", "1"]]) == ["A    BB", "xyz  1"]
    job = {"nspace": "ns@2", "uid": None, "session": 0, "state": "running", "started": 0,
           "ranks_per_node": {"a": 2, "c": 1},
           "apps": [{"argv": ["sh", "-c", "echo hi"], "n": 2}, {"argv": ["b"], "n": 1}]}
    header, row = ps_lines([job])
    assert row.split()[:6] == ["ns@2", "-", "0", "running", "-", "a:2,c:1"]
    assert row.endswith('-n 2 sh -c "echo hi" : -n 1 b')


@pytest.mark.parametrize("secs,shown", [(None, "-"), (0.42, "0.4s"), (42, "42s"),
                                        (303, "5m03s"), (7260, "2h01m"), (273600, "3d04h")])
def test_durations_read_at_a_glance(secs, shown):
    assert duration(secs) == shown


def test_store_lines_keep_the_counts_table_and_list_own_keys_after_it():
    row = {"store": "master", "items": 2, "parked": 0, "evictions": 1, "expiries": 0,
           "bytes_by_uid": {"1000": 290}, "keys": ["tok", "a b"],
           "key_info": [{"key": "tok", "persistence": "first-read", "range": "session",
                         "idle": 3.25, "expires_in": 296.75, "size": 6,
                         "publisher": "ns@2:0"}],
           "key_info_truncated": True}
    out = store_lines([row, {"store": "b", "error": "timed out"}])
    assert out[0].split() == ["store", "items", "parked", "evictions", "expiries", "bytes",
                              "by", "uid"]
    assert out[1].split() == ["master", "2", "0", "1", "0", "1000:", "290"]
    assert out[2].split() == ["your", "keys:", "tok", '"a', 'b"']
    assert out[3] == f"{'b':<20} unavailable: timed out"
    assert out[6].split() == ["STORE", "KEY", "PERSISTENCE", "RANGE", "IDLE", "EXPIRES", "SIZE",
                              "PUBLISHER"]
    assert out[7].split() == ["master", "tok", "first-read", "session", "3.2s", "4m56s", "6",
                              "ns@2:0"]
    assert out[8].startswith("(master holds more of your keys")


def test_job_end_after_an_interrupt_names_the_status_pydvm_run_exits_with():
    """Two processes failed (the first by SIGSEGV, 139), then Ctrl-C: pydvm run exits
    130, and the summary says so rather than 'the job exits with status 139'."""
    r = _reply(exit=139, failures=[[0, 0, "a", 139, 11], [1, 0, "b", 1, 0]], failed=2,
               killed=1, msg="its pydvm run was interrupted (signal 2)")
    out = job_end_lines(r, interrupted=True, exit_status=130)
    assert out[-1] == (
        "pydvm run: ns@4: 2 of the job's processes failed; the first to fail was [ns@4,0] "
        "(status 139), but pydvm run was interrupted by SIGINT, so it exits with status 130")
    assert job_end_lines({**r, "msg": ""}, interrupted=False, exit_status=139)[-1].endswith(
        "the first to fail was [ns@4,0], so the job exits with status 139")
