"""hello with mpi4py: the lines of hello.c (rank, size, host, allreduce)."""

import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
print(f"rank {rank} of {size} on {MPI.Get_processor_name()}", flush=True)
total = comm.allreduce(rank, op=MPI.SUM)
if total != size * (size - 1) // 2:
    print(f"sum wrong: {total} != {size * (size - 1) // 2}", flush=True)
    sys.exit(2)
if rank == 0:
    print(f"sum ok {MPI.Get_library_version().splitlines()[0]}", flush=True)
