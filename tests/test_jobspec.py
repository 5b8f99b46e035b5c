"""The job API's request building (pure: no DVM): it must say what ``pydvm run`` says."""

from __future__ import annotations

import os

import pytest

from pydvm.cli.run import build_request
from pydvm.cli.runopts import BY_NAME, KEYWORDS, OPTIONS, parse_run
from pydvm.client.jobspec import App, StdinFeed, output_sinks, run_request, split_command
from pydvm.protocol import STDIN_WINDOW

#: keyword value -> the same on the command line, for every keyword
SAME = [
    ({"map_by": "ppr:2:node:PE=1"}, ["--map-by", "ppr:2:node:PE=1"]),
    ({"rank_by": "node"}, ["--rank-by", "node"]),
    ({"bind_to": "core:overload-allowed"}, ["--bind-to", "core:overload-allowed"]),
    ({"npernode": 2}, ["-N", "2"]),
    ({"pernode": True}, ["--pernode"]),
    ({"npersocket": 1}, ["--npersocket", "1"]),
    ({"ppr": "1:node"}, ["--ppr", "1:node"]),
    ({"cpus_per_proc": 2}, ["--cpus-per-proc", "2"]),
    ({"oversubscribe": True}, ["--oversubscribe"]),
    ({"oversubscribe": False}, ["--nooversubscribe"]),
    ({"cpu_set": [0, 2, 3]}, ["--cpu-set", "0,2,3"]),
    ({"use_hwthread_cpus": True}, ["--use-hwthread-cpus"]),
    ({"report_bindings": True}, ["--report-bindings"]),
    ({"display_map": True, "display_allocation": True},
     ["--display-map", "--display-allocation"]),
    ({"stop_in_init": True}, ["--stop-in-init"]),
]


def test_every_keyword_stands_for_a_declared_option_and_each_is_tested():
    keys = {o.key for o in OPTIONS}
    assert set(KEYWORDS.values()) <= keys
    tested = {k for kw, _ in SAME for k in kw} | {"hostfile"}
    assert tested == set(KEYWORDS)


@pytest.mark.parametrize("kw,argv", SAME, ids=[" ".join(a) for _, a in SAME])
def test_a_keyword_makes_the_request_its_command_line_makes(kw, argv, tmp_path):
    cli = build_request(parse_run([*argv, "-n", "2", "true"]), {}, "/")
    api = run_request("true", 2, inherit_env=False, cwd="/", **kw)
    assert api == cli


def test_hostfile_hosts_env_and_mpmd_apps_as_on_the_command_line(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("a slots=2\nb\n")
    cli = build_request(parse_run(["--hostfile", str(hf), "true"]), {}, "/")
    assert run_request("true", None, hostfile=hf, inherit_env=False, cwd="/") == cli
    cli = build_request(parse_run(["--host", "a:2,b", "-n", "3", "-x", "V=1", "--wdir", "/tmp",
                                   "echo", "x", ":", "-n", "1", "true"]), {}, "/")
    api = run_request([App("echo x", 3, hosts="a:2,b", env={"V": "1"}, cwd="/tmp"),
                       App(["true"])], inherit_env=False, cwd="/")
    assert api == cli


def test_bad_values_are_refused_as_the_command_line_refuses_them():
    with pytest.raises(ValueError, match="--map-by"):
        run_request("true", map_by="nowhere")
    with pytest.raises(ValueError, match="-N must be at least 1"):
        run_request("true", npernode=0)
    with pytest.raises(ValueError, match="pernode is True or False"):
        run_request("true", pernode="yes")
    with pytest.raises(TypeError, match="unknown job option 'mapby'"):
        run_request("true", mapby="node")
    with pytest.raises(ValueError, match="timeout"):
        run_request("true", timeout=0)
    with pytest.raises(ValueError, match="MPMD"):
        run_request([App("true")], n=2)
    assert BY_NAME["--map-by"].key == "map_by"


def test_environment_and_working_directory(monkeypatch):
    monkeypatch.setenv("JOBSPEC_X", "1")
    req = run_request("true", env={"JOBSPEC_Y": "2", "JOBSPEC_X": None}, mca={"btl": "tcp"})
    assert req["env"]["JOBSPEC_Y"] == "2" and "JOBSPEC_X" not in req["env"]
    assert req["env"]["OMPI_MCA_btl"] == "tcp" and req["cwd"] == os.getcwd()
    with pytest.raises(ValueError, match="pydvm's parameters"):
        run_request("true", mca={"pydvm_output_window": 1})


def test_commands_split_as_a_shell_splits_them():
    assert split_command("echo 'a b' c") == ["echo", "a b", "c"]
    assert split_command("hostname") == ["hostname"]
    assert split_command(["ls", "-l"]) == ["ls", "-l"]
    with pytest.raises(TypeError):
        split_command(3)


def test_line_callbacks_join_pieces_per_rank_and_flush_the_last_partial_line():
    got = []
    out, err = output_sinks(lambda r, ln: got.append((r, ln)), None)
    assert err is None
    out.write(0, b"a")
    out.write(1, b"x\ny")
    out.write(0, b"b\nc\n")
    out.close()
    assert got == [(1, "x"), (0, "ab"), (0, "c"), (1, "y")]


def test_stdin_is_sent_within_the_window_then_end_of_file():
    feed = StdinFeed(b"x" * (STDIN_WINDOW + 10))
    first = feed.pieces("ns")
    assert sum(len(m["data"]) for m in first) == STDIN_WINDOW and not feed.done
    assert feed.pieces("ns") == []  # the window is full
    feed.ack(STDIN_WINDOW, False)
    rest = feed.pieces("ns")
    assert [len(m["data"]) for m in rest] == [10, 0] and rest[-1]["eof"] and feed.done


def test_a_text_stream_is_written_through_its_buffer(tmp_path):
    with open(tmp_path / "t", "w") as f:
        out, _ = output_sinks(f, None)
        out.write(0, b"bytes\n")
        out.close()
    assert (tmp_path / "t").read_text() == "bytes\n"


def test_signal_number_takes_numbers_names_and_refuses_the_rest():
    import signal

    from pydvm.client.jobspec import signal_number

    assert signal_number(signal.SIGUSR1) == signal_number("USR1") == signal.SIGUSR1
    assert signal_number("sigkill") == signal_number(" SIGKILL ") == 9
    assert signal_number("RTMIN+1") == signal.SIGRTMIN + 1
    for bad in ("NOPE", "SIG", "", 0, -9, 100_000):
        with pytest.raises(ValueError):
            signal_number(bad)
    for bad in (True, 1.5, None, b"USR1"):
        with pytest.raises(TypeError):
            signal_number(bad)
