"""The pieces that let the command line's fast path skip argparse, re and hmac
agree with what they replace: the in-job commands' light parser with the
argparse tree, the URI reader with the URI pattern, the handshake's MAC
with :mod:`hmac`, ``--version`` with argparse's."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydvm.cli import main
from pydvm.cli.injob import parse_light
from pydvm.cli.parser import build_parser
from pydvm.protocol import _URI_PATTERN, DvmUri, UriError, _split_uri, hmac_sha256, mac


_parser: list[argparse.ArgumentParser] = []


def argparse_result(command: str, args: list[str]) -> dict | None:
    """What the argparse tree makes of ``pydvm COMMAND ARGS`` (None: a usage error)."""
    if not _parser:
        _parser.append(build_parser())
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            a = _parser[0].parse_args([command, *args])
    except SystemExit:
        return None
    return vars(a)


def light_result(command: str, args: list[str]) -> dict | None:
    a = parse_light(command, args)
    return None if a is None else vars(a)


# Tokens an in-job command line is made of: every option, values good and
# bad for each, pairs and keys, and what argparse treats specially.
TOKENS = ["--range", "--persistence", "--access-uid", "--access-gid", "--replace", "--files",
          "--hold", "--wait", "--wait-count", "--timeout", "--json", "--rang", "--range=local",
          "-h", "--help", "--", "-", "-1", "-x", "--nope",
          "session", "local", "namespace", "nowhere", "indef", "proc", "first-read",
          "0", "1", "2.5", "4294967296", "inf", "nan", "x", "", "1e3",
          "k=v", "k=", "=v", "a=b=c", "k", "key two", "k=-", "k=@/etc/hostname"]


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(["publish", "lookup", "unpublish"]),
       st.lists(st.sampled_from(TOKENS), max_size=7))
def test_the_light_parser_agrees_with_argparse_wherever_it_answers(command, args):
    light = light_result(command, args)
    if light is not None:
        assert light == argparse_result(command, args), (command, args)


@pytest.mark.parametrize("command, args", [
    ("publish", ["k=v"]), ("publish", ["a=1", "b=2", "--range", "namespace"]),
    ("publish", ["--range", "local", "--persistence", "indef", "k=v", "--replace"]),
    ("publish", ["--access-uid", "0", "--access-uid", "12", "--access-gid", "5", "--range",
                 "custom", "k=v"]),
    ("publish", ["--files", "k=@/etc/hostname", "--hold", "1.5"]),
    ("lookup", ["k"]), ("lookup", ["a", "b", "--wait", "--timeout", "3"]),
    ("lookup", ["--wait-count", "1", "a", "b", "--json"]), ("lookup", ["--range", "local", "k"]),
    ("unpublish", []), ("unpublish", ["a", "b"]),
])
def test_the_usual_command_lines_take_the_light_path(command, args):
    light = light_result(command, args)
    assert light is not None, (command, args)
    assert light == argparse_result(command, args)


@pytest.mark.parametrize("command, args", [
    ("publish", []), ("lookup", []), ("publish", ["-h"]), ("lookup", ["k", "--timeout", "-1"]),
    ("lookup", ["--range", "nowhere", "k"]), ("lookup", ["a", "--json", "b"]),
    ("publish", ["--rep", "k=v"]), ("lookup", ["--", "-k"]), ("lookup", ["--range=local", "k"]),
])
def test_what_the_light_parser_leaves_to_argparse(command, args):
    assert parse_light(command, args) is None


def test_version_prints_what_argparse_printed():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--version"])
    assert stop.value.code == 0
    fast = io.StringIO()
    with contextlib.redirect_stdout(fast):
        assert main(["--version"]) == 0
    assert fast.getvalue() == out.getvalue() and fast.getvalue().startswith("pydvm ")


# ----------------------------------------------------------------------
# URIs and the MAC
# ----------------------------------------------------------------------

URI_RE = re.compile(_URI_PATTERN)
URI_PIECES = st.sampled_from(["tcp://", "tcp:/", "127.0.0.1", "host", "[", "]", "::1", ":",
                              "/", "4242", "0", "x", "_", "-", "a b", "é", "٣", "\n", "[::1]"])


def regex_split(text: str):
    m = URI_RE.match(text)
    return None if m is None else (m["host"], m["port"], m["dvm"])


@settings(max_examples=5000, deadline=None)
@given(st.lists(URI_PIECES, max_size=10).map("".join))
def test_the_uri_reader_matches_the_uri_pattern(text):
    assert _split_uri(text) == regex_split(text), text


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=20))
def test_the_uri_reader_matches_the_uri_pattern_around_any_text(s):
    for text in (s, f"tcp://{s}", f"tcp://h:1/{s}", f"tcp://{s}:5/ab", f"tcp://[{s}]:5/a",
                 f"tcp://h:{s}/a"):
        assert _split_uri(text) == regex_split(text), text


def test_uris_parse_as_before():
    assert DvmUri.parse(" tcp://127.0.0.1:4242/ab_c-1\n") == ("127.0.0.1", 4242, "ab_c-1")
    assert DvmUri.parse("tcp://[::1]:1/x") == ("::1", 1, "x")
    with pytest.raises(UriError, match=r"not a pydvm URI: 'garbage' \(expected "
                                       r"tcp://HOST:PORT/DVMID\)"):
        DvmUri.parse("garbage")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=300))
def test_the_handshake_mac_is_hmac_sha256(key, msg):
    assert hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def test_the_tool_mac_is_the_one_the_master_checks():
    from pydvm.runtime.shared.auth import check_auth

    secret, nonce = b"s" * 32, b"n" * 32
    assert check_auth(secret, nonce, {"t": "auth", "role": "tool",
                                      "mac": mac(secret, nonce, "tool")}) == ""
    assert check_auth(secret, nonce, {"t": "auth", "role": "tool",
                                      "mac": mac(secret, nonce, "daemon")}) == "bad credentials"



def test_a_closed_stdout_or_stderr_is_no_traceback():
    """``pydvm --version >&-`` (a script closing what it does not want):
    what would go there is dropped, as print() does, and the command works."""
    import subprocess
    import sys
    for redirect in (">&-", "2>&-", ">&- 2>&-"):
        p = subprocess.run(["sh", "-c", f'"$0" -m pydvm --version {redirect}', sys.executable],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, (redirect, p.stderr)
        assert "Traceback" not in p.stderr and "Error" not in p.stderr, (redirect, p.stderr)
