"""Values that do not fit a command line, and output a script can read (issue 11).

``--files K=@FILE`` and ``--files K=-`` publish bytes as bytes (without
``--files`` every value is the str written, as SPEC 9 says); ``lookup
--json`` gives value, type and publisher; plain output prints a str value as
it is (spaces included) unless a line break would split the line, and quotes
a key that is not one token;
``pydvm store`` shows each of the caller's keys with its persistence, idle
time, size and publisher.
"""

from __future__ import annotations

import base64
import json
import os

import pytest

from dvmkit import lines, status

pytestmark = pytest.mark.e2e

UID = str(os.getuid())


def _lookup_json(dvm, *keys: str) -> dict:
    p = dvm.run("-n", "1", "pydvm", "lookup", "--json", *keys)
    return json.loads(p.stdout)


def test_publish_at_file_stores_the_files_bytes_as_bytes(dvm, tmp_path):
    """K=@FILE with binary content: lookup --json returns type bytes, base64 of exactly it."""
    data = bytes(range(256)) + b"\n\x00end"
    f = tmp_path / "blob.bin"
    f.write_bytes(data)
    p = dvm.run("-n", "1", "pydvm", "publish", "--files", f"blob=@{f}", "--persistence",
                "session")
    assert lines(p, "PUBLISHED") == ["PUBLISHED blob"] and status(p) == "PMIX_SUCCESS", p.stderr
    got = _lookup_json(dvm, "blob")
    assert got["status"] == "PMIX_SUCCESS" and got["missing"] == []
    assert got["found"]["blob"]["type"] == "bytes"
    assert base64.b64decode(got["found"]["blob"]["value"]) == data
    assert got["found"]["blob"]["publisher"]["rank"] == 0
    # Plain output shows a bytes value as its Python literal, on one line.
    q = dvm.run("-n", "1", "pydvm", "lookup", "blob")
    (found,) = lines(q, "FOUND")
    assert found.startswith("FOUND blob b'\\x00\\x01") and found.endswith(
        f" from {got['found']['blob']['publisher']['nspace']}:0")


def test_publish_dash_reads_the_value_from_standard_input(dvm):
    """`printf 'a b\\nc' | pydvm publish k=-` inside a job stores those bytes."""
    p = dvm.run("-n", "1", "sh", "-c",
                "printf 'a b\\nc' | pydvm publish --files k=- --persistence session")
    assert status(p) == "PMIX_SUCCESS", p.stdout + p.stderr
    got = _lookup_json(dvm, "k")["found"]["k"]
    assert got["type"] == "bytes" and base64.b64decode(got["value"]) == b"a b\nc"


def test_publish_dash_with_nothing_piped_in_is_refused(dvm):
    """Rank 0 reads `pydvm run`'s stdin, here /dev/null: `pydvm publish --files k=-`
    there is BAD_PARAM, never an empty value, and the message says how to publish
    '-' itself."""
    p = dvm.run("-n", "1", "pydvm", "publish", "--files", "k=-", "--persistence", "session")
    assert status(p) == "PMIX_ERR_BAD_PARAM" and p.returncode == 1
    assert "without --files" in p.stderr, p.stderr
    assert _lookup_json(dvm, "k")["status"] == "PMIX_ERR_NOT_FOUND"


def test_publish_of_an_unreadable_file_stores_nothing_and_says_why(dvm, tmp_path):
    """K=@missing: BAD_PARAM naming the file, exit 1, and the other pair is not published."""
    missing = tmp_path / "nope"
    p = dvm.run("-n", "1", "sh", "-c",
                f"pydvm publish --files good=1 bad=@{missing} --persistence session; "
                "pydvm lookup good")
    assert "PUBLISHED" not in p.stdout and "STATUS PMIX_ERR_BAD_PARAM" in p.stdout
    assert str(missing) in p.stderr, p.stderr
    assert "STATUS PMIX_ERR_NOT_FOUND" in p.stdout


def test_without_files_at_and_dash_values_are_published_as_strings(dvm):
    """SPEC 9 unchanged: `k=@home` and `d=-` are the strings '@home' and '-'."""
    p = dvm.run("-n", "1", "pydvm", "publish", "k=@home", "d=-", "--persistence", "session")
    assert status(p) == "PMIX_SUCCESS", p.stderr
    got = _lookup_json(dvm, "k", "d")["found"]
    assert got["k"] == {**got["k"], "value": "@home", "type": "str"}
    assert got["d"]["value"] == "-" and got["d"]["type"] == "str"


def test_lookup_json_gives_status_and_per_key_value_type_and_publisher(dvm):
    """Found and missing keys in one JSON object; exit 1 on partial success."""
    dvm.run("--host", "b", "-n", "1", "pydvm", "publish", "s=hello", "--persistence", "session",
            check=True)
    p = dvm.run("-n", "1", "pydvm", "lookup", "--json", "s", "absent")
    assert p.returncode == 1
    got = json.loads(p.stdout)  # the whole stdout is one JSON object
    assert got["status"] == "PMIX_ERR_PARTIAL_SUCCESS"
    assert got["found"]["s"]["value"] == "hello" and got["found"]["s"]["type"] == "str"
    assert got["found"]["s"]["publisher"]["nspace"].startswith("pydvm-")
    assert got["missing"] == ["absent"]
    q = dvm.run("-n", "1", "pydvm", "lookup", "--json", "absent")
    assert q.returncode == 1 and json.loads(q.stdout) == {
        "status": "PMIX_ERR_NOT_FOUND", "found": {}, "missing": ["absent"]}


def test_plain_lookup_prints_values_as_is_and_quotes_only_line_breaks_and_odd_keys(dvm):
    """A str value prints as is, spaces included (SPEC 9); `x\\ny` (a line break) and a key
    with a space are quoted, so every FOUND is one line and its key one token."""
    dvm.run("-n", "1", "pydvm", "publish", "plain=tcp://x:1", "spaced=a b", "multi=x\ny",
            "my key=v", "--persistence", "session", check=True)
    p = dvm.run("-n", "1", "pydvm", "lookup", "plain", "spaced", "multi", "my key")
    assert status(p) == "PMIX_SUCCESS"
    found = {ln.split(" from ")[0] for ln in lines(p, "FOUND")}
    assert found == {'FOUND plain tcp://x:1', 'FOUND spaced a b', 'FOUND multi "x\\ny"',
                     'FOUND "my key" v'}, p.stdout
    q = dvm.run("-n", "1", "pydvm", "publish", "other key=1")
    assert lines(q, "PUBLISHED") == ['PUBLISHED "other key"']


def test_duplicate_key_message_names_the_replace_flag(dvm):
    """Publishing a key twice: PMIX_ERR_DUPLICATE_KEY and stderr suggests --replace."""
    dvm.run("-n", "1", "pydvm", "publish", "dup=1", "--persistence", "session", check=True)
    p = dvm.run("-n", "1", "pydvm", "publish", "dup=2", "--persistence", "session")
    assert status(p) == "PMIX_ERR_DUPLICATE_KEY" and p.returncode == 1
    assert "--replace" in p.stderr, p.stderr
    q = dvm.run("-n", "1", "pydvm", "publish", "dup=2", "--persistence", "session", "--replace")
    assert status(q) == "PMIX_SUCCESS", q.stderr


def test_store_shows_each_own_key_with_persistence_idle_expiry_size_and_publisher(dvm):
    """`pydvm store`: SPEC 9's JSON fields unchanged, plus key_info per own key; plain
    output lists the keys in a table."""
    p = dvm.run("--host", "b", "-n", "1", "sh", "-c",
                'echo "NS $PYDVM_NSPACE"; pydvm publish tok=abc --persistence first-read && '
                "pydvm publish here=1 --persistence indef --range local")
    ns = lines(p, "NS ")[0].split()[1]
    stores = dvm.store()
    master = stores["master"]
    assert {"store", "items", "bytes_by_uid", "parked", "evictions", "expiries"} <= set(master)
    (tok,) = master["key_info"]
    assert tok["key"] == "tok" and tok["persistence"] == "first-read"
    assert tok["range"] == "session" and tok["size"] == len("tok") + len("abc")
    assert tok["publisher"] == f"{ns}:0" and 0 <= tok["idle"] < 60
    assert 240 < tok["expires_in"] <= 300  # default prte_data_server_timeout
    (here,) = stores["b"]["key_info"]
    assert here["key"] == "here" and here["range"] == "local" and here["persistence"] == "indef"
    plain = dvm.cmd("store", check=True).stdout.splitlines()
    assert any(ln.split()[:2] == ["your", "keys:"] and "tok" in ln for ln in plain), plain
    (row,) = [ln for ln in plain if ln.startswith("master ") and " tok " in ln]
    assert row.split()[2:4] == ["first-read", "session"] and row.split()[-1] == f"{ns}:0", row


def test_without_files_a_value_naming_a_file_or_dash_is_literal_with_a_hint(dvm, tmp_path):
    """`big=@FILE` of an existing file and `d=-` without --files: still the strings
    written (SPEC 9), with one stderr note each saying so and naming --files;
    `k=@nothing-here` (no such file) and --files publishes get no note."""
    f = tmp_path / "big.bin"
    f.write_bytes(b"\x00\x01payload")
    p = dvm.run("-n", "1", "pydvm", "publish", f"big=@{f}", "d=-", "plain=@nothing-here",
                "--persistence", "session")
    assert status(p) == "PMIX_SUCCESS" and p.returncode == 0, p.stderr
    notes = p.stderr.strip().splitlines()
    assert len(notes) == 2, notes
    big, dash = notes
    assert big.startswith("pydvm publish: note: big ") and "literal" in big, big
    assert f"'@{f}'" in big and "--files" in big, big
    assert dash.startswith("pydvm publish: note: d ") and "--files" in dash, dash
    got = _lookup_json(dvm, "big", "d", "plain")["found"]
    assert got["big"]["value"] == f"@{f}" and got["big"]["type"] == "str"
    assert got["d"]["value"] == "-" and got["plain"]["value"] == "@nothing-here"
    q = dvm.run("-n", "1", "pydvm", "publish", "--files", f"raw=@{f}", "--persistence",
                "session")
    assert status(q) == "PMIX_SUCCESS" and q.stderr == "", q.stderr
