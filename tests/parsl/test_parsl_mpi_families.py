"""An MPI app through Parsl's MPIExecutor on DVM blocks, for each MPI family.

A ``@bash_app`` running ``$PARSL_MPI_PREFIX ./prog`` with ``num_ranks=2,
ranks_per_node=1`` (over ``num_nodes=2``) in a block of
``PydvmProvider(nodes_per_block=2, launcher=SimpleLauncher())``: the
block's ``mpiexec`` is pydvm's, which runs the ranks with ``pydvm run
--mpi auto``, so the DVM reads the interface off the program -- PMI-1 for
MPICH (Debian's ``mpicc.mpich``), PMIx for Open MPI (``mpicc``).  The two
ranks must be one MPI_COMM_WORLD of size 2 on the two nodes, their
allreduce right, each given only its family's interface."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("parsl")

import parsl  # noqa: E402
from parsl.app.app import bash_app  # noqa: E402
from parsl.config import Config  # noqa: E402
from parsl.executors import MPIExecutor  # noqa: E402
from parsl.launchers import SimpleLauncher  # noqa: E402

from parslkit import FAMILIES, ranks_printed  # noqa: E402
from pydvm.parsl import PydvmProvider  # noqa: E402

pytestmark = pytest.mark.e2e


@bash_app
def run_prog(parsl_resource_specification={}, stdout=None, stderr=None):
    return "$PARSL_MPI_PREFIX ./prog"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_mpi_app_gets_one_world_over_two_nodes_with_its_familys_interface(
        family, on_dvm, mpi_sum, tmp_path):
    shutil.copy(mpi_sum(family), tmp_path / "prog")
    config = Config(executors=[MPIExecutor(
        max_workers_per_block=1, mpi_launcher="mpiexec",
        provider=PydvmProvider(nodes_per_block=2, launcher=SimpleLauncher()))],
        run_dir=str(tmp_path / "runinfo"), strategy="none")
    spec = {"num_ranks": 2, "ranks_per_node": 1, "num_nodes": 2}
    with parsl.load(config):
        f = run_prog(parsl_resource_specification=spec, stdout="prog.out", stderr="prog.err")
        assert f.result(240) == 0, (tmp_path / "prog.err").read_text()
    rows = ranks_printed((tmp_path / "prog.out").read_text())
    iface = FAMILIES[family][2]
    assert [(r, size, s, via) for r, size, _, s, via in rows] == \
        [(0, 2, 1, iface), (1, 2, 1, iface)], (tmp_path / "prog.out").read_text()
    assert sorted(node for _, _, node, _, _ in rows) == ["a", "b"]
