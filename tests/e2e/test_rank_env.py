"""The environment every rank gets, against Open MPI 4.1's ``mpirun``
(runtime/node/ompienv.py; docs/runtime.md, "The rank environment").

The same command -- a shell printing its ``OMPI_*`` variables -- runs under
``mpirun`` and under ``pydvm run`` (a one-shot DVM on this machine; a
persistent DVM of two nodes against ``mpirun`` over two test hosts in network
namespaces of their own), and what a job script reads is compared.  Where
pydvm differs on purpose, the test pins the difference:

* ``OMPI_FILE_LOCATION``: a directory per rank in pydvm's job directory on
  the node (removed with the job), where mpirun names its own session
  directory, one per node;
* ``OMPI_FIRST_RANKS`` of an MPMD job: each app's first rank ("0 2"), where
  mpirun 4.1.4 says "0 0";
* ``OMPI_UNIVERSE_SIZE``: the session's slots and at least the job's size,
  as ``PMIX_UNIV_SIZE`` (mpirun: the slots of its allocation, even below the
  job's size when oversubscribed);
* ORTE's internal variables (``OMPI_MCA_orte_hnp_uri``, ``OMPI_MCA_ess``,
  ``OMPI_MCA_pmix``, the session directories ...) are not set: they would
  send MPI_Init down ORTE's paths instead of PMIx.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dvmkit import PYDVM, start_dvm

sys.path.insert(0, str(Path(__file__).parent.parent / "multinode"))
from hostnet import HostNet, unavailable_reason  # noqa: E402

#: Prints, per rank, "R<rank> NAME=value" for every OMPI_* variable, and
#: whether OMPI_FILE_LOCATION is a directory the rank can write in (under
#: mpirun 4.1.4 it does not exist unless files were pre-positioned).
SCRIPT = ('env | grep "^OMPI_" | sed "s/^/R$OMPI_COMM_WORLD_RANK /"; '
          'touch "$OMPI_FILE_LOCATION/x" 2>/dev/null && echo "R$OMPI_COMM_WORLD_RANK FILEDIR ok"; '
          'true')
CMD = ["sh", "-c", SCRIPT, "envprobe", "two words"]
#: what a job script reads, or MPI_Init takes from its launcher
USER_VARS = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "OMPI_UNIVERSE_SIZE",
             "OMPI_APP_CTX_NUM_PROCS", "OMPI_NUM_APP_CTX", "OMPI_FIRST_RANKS",
             "OMPI_MCA_initial_wdir", "OMPI_MCA_orte_app_num", "OMPI_MCA_orte_num_nodes",
             "OMPI_MCA_orte_ess_node_rank", "OMPI_MCA_orte_ess_num_procs", "OMPI_COMMAND",
             "OMPI_ARGV", "OMPI_MCA_mpi_oversubscribe", "OMPI_FILE_LOCATION"}
#: ORTE's own: mpirun sets them, pydvm must not
ORTE_ONLY = {"OMPI_MCA_orte_hnp_uri", "OMPI_MCA_orte_local_daemon_uri", "OMPI_MCA_ess",
             "OMPI_MCA_pmix", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_ess_base_vpid",
             "OMPI_MCA_orte_precondition_transports", "OMPI_MCA_orte_jobfam_session_dir",
             "OMPI_MCA_orte_top_session_dir", "OMPI_MCA_orte_launch"}
#: a submitting shell's stale launch state (a job script run inside another job)
STALE = {"OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_LOCAL_RANK": "7",
         "OMPI_UNIVERSE_SIZE": "99", "OMPI_MCA_orte_hnp_uri": "1.0;tcp://192.0.2.9:1",
         "OMPI_MCA_ess": "^singleton", "OMPI_MCA_ess_base_vpid": "7",
         "OMPI_FILE_LOCATION": "/nonexistent"}


def _ranks(out: str) -> dict[int, dict[str, str]]:
    got: dict[int, dict[str, str]] = {}
    for ln in out.splitlines():
        tag, _, kv = ln.partition(" ")
        if not tag.startswith("R") or not tag[1:].isdigit():
            continue
        name, _, value = kv.partition("=")
        got.setdefault(int(tag[1:]), {})[name] = value
    return got


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYDVM_", "PMIX_", "OMPI_", "SLURM_"))}


def _mpirun(argv: list[str], cwd: Path, extra: list[str] = ()) -> dict[int, dict[str, str]]:
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    p = subprocess.run(["mpirun", "--allow-run-as-root", *extra, *argv], env=_env(), cwd=cwd,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    return _ranks(p.stdout)


def _compare(ours: dict[int, dict[str, str]], ref: dict[int, dict[str, str]],
             pinned: dict[str, object]) -> None:
    """Every rank's USER_VARS equal under both, but for ``pinned`` (name ->
    pydvm's value, or a callable checking it) and OMPI_FILE_LOCATION (set
    by both, pydvm's its own, checked by the caller)."""
    assert sorted(ours) == sorted(ref)
    for r in ref:
        mine, theirs = ours[r], ref[r]
        for name in sorted(USER_VARS):
            assert (name in mine) == (name in theirs), (r, name, mine.get(name),
                                                          theirs.get(name))
            if name == "OMPI_FILE_LOCATION" or name not in mine:
                continue
            if name in pinned:
                want = pinned[name]
                assert want(mine[name]) if callable(want) else mine[name] == want, \
                    (r, name, mine[name], theirs[name])
            else:
                assert mine[name] == theirs[name], (r, name, mine[name], theirs[name])
        assert not ORTE_ONLY & set(mine), (r, sorted(ORTE_ONLY & set(mine)))
        assert ORTE_ONLY - {"OMPI_MCA_orte_launch"} <= set(theirs)  # so the pin means something


def _file_locations(ours: dict[int, dict[str, str]], out: str) -> None:
    """pydvm's OMPI_FILE_LOCATION: one directory per rank, made for it."""
    locs = [ours[r]["OMPI_FILE_LOCATION"] for r in ours]
    assert len(set(locs)) == len(locs), locs
    assert all("/pydvm-" in loc and "-jobs-" in loc for loc in locs), locs
    assert sorted(ln for ln in out.splitlines() if ln.endswith(" FILEDIR ok")) == sorted(
        f"R{r} FILEDIR ok" for r in ours), out
    assert not any(os.path.exists(loc) for loc in locs)  # removed with the job


@pytest.mark.parametrize("pmix", ["on", "off"])
def test_one_shot_ranks_read_what_mpirun_gives_them(tmp_path, pmix):
    """An MPMD job of 2 + 1 ranks on this machine (oversubscribed on a 2-core
    machine, at least as many ranks as cores elsewhere), PMIx or plain: the
    same variables as under mpirun, none of a stale one from the shell that
    ran ``pydvm run``."""
    cores = os.cpu_count() or 1
    n0 = max(2, cores)  # rank count of app 0: app 1's rank oversubscribes the machine
    argv = ["-n", str(n0), *CMD, ":", "-n", "1", *CMD]
    ref = _mpirun(argv, tmp_path, ["--oversubscribe"])
    env = {**_env(), **STALE, "PYDVM_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run(PYDVM + ["run", "--mca", "pydvm_pmix", pmix, *argv], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    ours = _ranks(p.stdout)
    size = n0 + 1
    _compare(ours, ref, {
        "OMPI_FIRST_RANKS": f"0 {n0}",  # mpirun 4.1.4: "0 0"
        # the one-shot DVM's slots (its CPUs), at least the job's size; mpirun: its slots
        "OMPI_UNIVERSE_SIZE": str(size),
    })
    assert ref[0]["OMPI_FIRST_RANKS"] == "0 0"
    assert ref[0]["OMPI_UNIVERSE_SIZE"] == str(cores)
    assert ref[0]["OMPI_MCA_mpi_oversubscribe"] == "1"
    assert ref[0]["OMPI_ARGV"] == f"-c {SCRIPT} envprobe two words"
    assert ours[0]["OMPI_MCA_initial_wdir"] == str(tmp_path)
    assert {r: v["OMPI_COMM_WORLD_RANK"] for r, v in ours.items()} == {
        r: str(r) for r in range(size)}
    _file_locations(ours, p.stdout)


def test_one_node_not_oversubscribed_says_so(tmp_path):
    """As many ranks as the machine has cores: ``OMPI_MCA_mpi_oversubscribe=0``
    under both (Open MPI then spins while it waits instead of yielding)."""
    n = os.cpu_count() or 1
    argv = ["-n", str(n), *CMD]
    ref = _mpirun(argv, tmp_path)
    env = {**_env(), "PYDVM_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run(PYDVM + ["run", *argv], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    ours = _ranks(p.stdout)
    _compare(ours, ref, {})
    assert {v["OMPI_MCA_mpi_oversubscribe"] for v in ours.values()} == {"0"}
    _file_locations(ours, p.stdout)


NETNS_AGENT = """#!/bin/sh
h=$1; shift
exec ip netns exec "$h" unshare --uts sh -c "hostname $h; $*"
"""
TAG = 236
HOSTS = ["re1", "re2"]


def test_two_nodes_of_a_persistent_dvm_as_two_hosts_under_mpirun(tmp_path):
    """Two ranks on two nodes of a persistent DVM of three (one slot each)
    against ``mpirun --host re1:1,re2:1`` over two test hosts: each rank is
    local rank 0 of 1 on its node, 2 nodes; the universe is the DVM's 3 slots,
    mpirun's its allocation's: its own node's cores and the two hosts' slot
    (pinned: docs/runtime.md)."""
    why = unavailable_reason()
    if why:
        pytest.skip(f"needs test hosts: {why}")
    agent = tmp_path / "netns-agent"
    agent.write_text(NETNS_AGENT)
    agent.chmod(0o755)
    net_only = f"10.250.{TAG}.0/24"
    with HostNet(len(HOSTS), tag=TAG, want=list(HOSTS)):
        ref = _mpirun(["--host", ",".join(f"{h}:1" for h in HOSTS), "-n", "2",
                       "--mca", "plm_rsh_agent", str(agent),
                       "--mca", "plm_rsh_no_tree_spawn", "1",
                       "--mca", "oob_tcp_if_include", net_only, *CMD], tmp_path)
    with start_dvm(tmp_path / "dvm", "a:1,b:1,c:1") as d:
        p = d.run("--host", "a,b", "-n", "2", *CMD, cwd=tmp_path, env=STALE)
        assert p.returncode == 0, p.stdout + p.stderr
        ours = _ranks(p.stdout)
    _compare(ours, ref, {"OMPI_UNIVERSE_SIZE": "3"})
    # mpirun's universe is its whole allocation, the node mpirun runs on (as
    # many slots as cores) included, not only the hosts of the job
    assert ref[0]["OMPI_UNIVERSE_SIZE"] == str((os.cpu_count() or 1) + 2)
    assert ref[1]["OMPI_MCA_orte_num_nodes"] == "2"
    assert [ours[r]["OMPI_COMM_WORLD_LOCAL_RANK"] for r in (0, 1)] == ["0", "0"]
    _file_locations(ours, p.stdout)
