"""Debian's MPICH 4.0.2 under pydvm run: what its PMI-1 server does beyond
running the programs (tests/mpifamily runs them beside each MPI's own
launcher): a rank's environment, the name service across jobs and users'
tools, programs behind a wrapper, the interface asked for, one-shot DVMs.

MPICH finds its launcher through PMI-1; before pydvm served it, each of its
jobs ran as N one-rank programs that exited 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HYDRA_TIMEOUT = 60


def hydra(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The same program under MPICH's own launcher (every rank on this machine)."""
    return subprocess.run(["mpiexec.hydra", *args], capture_output=True, text=True,
                          timeout=HYDRA_TIMEOUT, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def ranks(out: str) -> list[str]:
    """The 'rank R of N' part of each line, sorted (hosts differ between launchers)."""
    return sorted(m.group(0) for m in re.finditer(r"rank \d+ of \d+", out))


def test_each_rank_knows_its_node_share(dvm2):
    """What a PMI-1 rank finds in its environment (as Hydra gives it), and no PMIx."""
    p = dvm2.run("--mpi", "pmi1", "--host", "a:2,b:2", "-n", "4", "--map-by", "slot",
                 "sh", "-c", "echo $PMI_RANK $PMI_SIZE $MPI_LOCALNRANKS $MPI_LOCALRANKID "
                 "$PYDVM_NODE ${PMI_FD:+fd} ${PMIX_NAMESPACE:-nopmix}")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [
        "0 4 2 0 a fd nopmix", "1 4 2 1 a fd nopmix", "2 4 2 0 b fd nopmix",
        "3 4 2 1 b fd nopmix"]


def test_a_published_name_is_found_by_another_job_and_by_pydvm_lookup(dvm2, mpich):
    env = {**dvm2.env, "PYDVM_URI": dvm2.uri}
    server = subprocess.Popen([sys.executable, "-m", "pydvm", "run", "--host", "a:1", "-n", "1",
                               mpich["names"], "publish", "pmi1-svc", "tag#0$"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "published pmi1-svc"
        found = dvm2.run("--host", "b:1", "-n", "1", mpich["names"], "lookup", "pmi1-svc")
        assert found.returncode == 0, found.stderr
        assert found.stdout.strip() == "found pmi1-svc tag#0$"
        tool = dvm2.run("-n", "1", "pydvm", "lookup", "pmi1-svc")
        assert "FOUND pmi1-svc tag#0$" in tool.stdout, tool.stdout + tool.stderr
        server.stdin.write("\n")
        server.stdin.flush()
        assert server.stdout.readline().strip() == "unpublished pmi1-svc"
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
        server.wait(timeout=30)
    gone = dvm2.run("--host", "b:1", "-n", "1", mpich["names"], "lookup", "pmi1-svc")
    assert gone.stdout.strip() == "missing pmi1-svc", gone.stdout + gone.stderr
    # under mpiexec.hydra two jobs do not share names (each has its own name
    # server); one job of two apps does
    both = hydra("-n", "1", mpich["names"], "publish", "h-svc", "v", ":",
                 "-n", "1", mpich["names"], "lookup", "nosuch", stdin="\n")
    assert "missing nosuch" in both.stdout


def test_a_name_gone_with_its_job_is_missing_at_once(dvm2, mpich):
    p = dvm2.run("--host", "b:1", "-n", "1", mpich["names"], "lookup", "never-published")
    assert p.returncode == 3 and p.stdout.strip() == "missing never-published"


def test_a_wrapped_mpich_program_ends_the_job_with_advice_never_singletons(dvm2, mpich):
    """A shell in front of the program: pydvm cannot read the MPI off 'sh', so
    it offers PMIx and watches for PMI-1; the job must not exit 0 as four
    one-rank programs."""
    p = dvm2.run("--host", "a:2,b:2", "-n", "4", "sh", "-c", f"exec {mpich['hello']}")
    assert p.returncode != 0, p.stdout
    assert "of 1" not in p.stdout
    assert "run it with --mpi pmi1" in p.stderr
    right = dvm2.run("--mpi", "pmi1", "--host", "a:2,b:2", "-n", "4", "sh", "-c",
                     f"exec {mpich['hello']}")
    assert right.returncode == 0 and ranks(right.stdout) == [f"rank {r} of 4" for r in range(4)]


def test_pmix_asked_for_an_mpich_program_says_what_to_pass(dvm2, mpich):
    p = dvm2.run("--pmix", "--host", "a:1,b:1", "-n", "2", mpich["hello"])
    assert p.returncode != 0
    assert "run it with --mpi pmi1" in p.stderr


def test_mpi_none_gives_no_interface(dvm2, mpich):
    """--mpi none: no PMI-1, no PMIx -- MPICH runs as singletons, as under srun --mpi=none."""
    p = dvm2.run("--mpi", "none", "--host", "a:1", "-n", "1", "sh", "-c",
                 "echo ${PMI_FD:-nofd} ${PMIX_NAMESPACE:-nopmix}")
    assert p.stdout.strip() == "nofd nopmix"


def test_a_one_shot_dvm_serves_pmi1_too(mpich, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYDVM_URI"}
    p = subprocess.run([sys.executable, "-m", "pydvm", "run", "--host", "x:2,y:2", "-n", "4",
                        mpich["hello"]], capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert ranks(p.stdout) == [f"rank {r} of 4" for r in range(4)]


CLOSEFDS = str(Path(__file__).parent / "jobs" / "closefds.py")


def test_a_wrapper_that_closes_descriptors_needs_the_port_form(mpich, tmp_path):
    """PMI_FD does not survive a wrapper that closes inherited descriptors;
    pydvm_pmi1_wire port gives PMI_PORT and a one-time PMI_ID instead."""
    env = {k: v for k, v in os.environ.items() if k != "PYDVM_URI"}
    base = [sys.executable, "-m", "pydvm", "run", "--mpi", "pmi1", "--host", "x:2,y:2",
            "-n", "4"]
    wrapped = [sys.executable, CLOSEFDS, mpich["hello"]]
    fd = subprocess.run(base + wrapped, capture_output=True, text=True, timeout=60, env=env,
                        stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert fd.returncode != 0
    port = subprocess.run(base[:4] + ["--mca", "pydvm_pmi1_wire", "port"] + base[4:] + wrapped,
                          capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert port.returncode == 0, port.stderr
    assert ranks(port.stdout) == [f"rank {r} of 4" for r in range(4)]


PORT_PROBE = r"""
import os, socket, sys
host, port = os.environ["PMI_PORT"].split(":")
def ask(line):
    s = socket.create_connection((host, int(port)), timeout=20)
    s.sendall(line.encode())
    data = b""
    while True:
        part = s.recv(4096)
        if not part:
            break
        data += part
        if line.startswith("cmd=initack") and data.count(b"\n") >= 4:
            break
    return data.decode()
print("bogus:", ask("cmd=initack pmiid=1\n").strip() or "closed", flush=True)
print("garbage:", ask("hello there\n").strip() or "closed", flush=True)
mine = ask(f"cmd=initack pmiid={os.environ['PMI_ID']}\n").split()
print("mine:", " ".join(mine), flush=True)
print("again:", ask(f"cmd=initack pmiid={os.environ['PMI_ID']}\n").strip() or "closed")
"""


def test_the_port_takes_each_pmi_id_once_and_nothing_else(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYDVM_URI"}
    probe = tmp_path / "probe.py"
    probe.write_text(PORT_PROBE)
    p = subprocess.run([sys.executable, "-m", "pydvm", "run", "--mca", "pydvm_pmi1_wire", "port",
                        "--mpi", "pmi1", "-n", "2", sys.executable, str(probe)],
                       capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out.count("bogus: closed") == 2 and out.count("garbage: closed") == 2, out
    mine = sorted(ln for ln in out if ln.startswith("mine:"))
    assert mine == ["mine: cmd=initack rc=0 cmd=set size=2 cmd=set rank=0 cmd=set debug=0",
                    "mine: cmd=initack rc=0 cmd=set size=2 cmd=set rank=1 cmd=set debug=0"], out
    assert out.count("again: closed") == 2, out
