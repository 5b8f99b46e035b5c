"""An mpi4py job: what MPI says of the world, an allreduce, and (optionally) a
rank that fails.  ``python3 -m mpi4py mpi4py_world.py [fail RANK]``: the
rank raises, and ``-m mpi4py`` turns the uncaught exception into MPI_Abort."""

import sys

from mpi4py import MPI

world = MPI.COMM_WORLD
rank = world.Get_rank()
print(f"WORLD rank={rank} size={world.Get_size()} "
      f"universe={world.Get_attr(MPI.UNIVERSE_SIZE)} appnum={world.Get_attr(MPI.APPNUM)}",
      flush=True)
if len(sys.argv) > 2 and sys.argv[1] == "fail" and rank == int(sys.argv[2]):
    raise RuntimeError(f"rank {rank} fails on purpose")
total = world.allreduce(rank)
print(f"SUM rank={rank} sum={total}", flush=True)
