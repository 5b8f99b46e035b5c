"""What Open MPI 4.1 programs are told by the environment pydvm gives each
rank, against Open MPI's own ``mpirun`` (runtime/ompienv.py; docs/runtime.md,
"The rank environment"): MPI_INFO_ENV and MPI_UNIVERSE_SIZE, a spawned job's
own shared-memory directories on each node, oversubscription.
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import local_mpi
from dvmkit import start_dvm, wait_for
from pmixkit import FAR, HEAD


@pytest.fixture
def one_slot_dvm(tmp_path, libpmix):
    """The head node and ``far`` with one slot each: a spawned job of two fills both."""
    with start_dvm(tmp_path, f"{HEAD}:1,{FAR}:1", {"pydvm_pmix": "on"}) as d:
        yield local_mpi(d)


def _job_files(dvmid: str) -> set[str]:
    """Files under this DVM's nodes' job directories in /dev/shm (their
    ``owner`` marks aside)."""
    out = set()
    for root, _dirs, files in os.walk("/dev/shm"):
        if f"/{dvmid}-" in root and "-jobs-" in root:
            out |= {os.path.join(root, f) for f in files if f != "owner"}
    return out


def test_spawned_children_on_two_nodes_use_their_own_nodes_directories(one_slot_dvm, mpicc):
    """MPI_Comm_spawn copies every OMPI_MCA_* of the parent into its children,
    the shared-memory directory pydvm chose for the parent's node included:
    the child on ``far`` must still get ``far``'s own (two children of one
    machine sharing one directory overwrite each other's segments: segfaults
    or hangs), the job works, and no file is left in any job directory."""
    d = one_slot_dvm
    dvmid = d.uri.rsplit("/", 1)[1]
    exe = mpicc("mpi_spawn_dirs")
    for _ in range(2):
        p = d.run("--host", HEAD, "-n", "1", exe, "2", "20", timeout=90)
        assert p.returncode == 0, p.stdout + p.stderr
        kids = re.findall(r"CHILD rank=(\d) size=2 node=(\S+) vader=(\S+) tmpdir=(\S+) "
                          r"files=(\S+)", p.stdout)
        assert sorted(k[1] for k in kids) == sorted([HEAD, FAR]), p.stdout
        assert [(node, vader, tmpdir) for _r, node, vader, tmpdir, _f in kids
                if f"/{dvmid}-{node}-jobs-" not in vader or tmpdir != vader] == [], p.stdout
        for _rank, node, vader, tmpdir, files in kids:
            assert files.startswith(vader + "/"), (vader, files)  # OMPI_FILE_LOCATION
        assert p.stdout.count("DONE sum=") == 2 and "BAD" not in p.stdout, p.stdout
        assert "PARENT rounds=20" in p.stdout
    left = wait_for(lambda: not _job_files(dvmid) or None, timeout=15, what="no job files") \
        if _job_files(dvmid) else True
    assert left and not _job_files(dvmid)
