"""mpi4py's TestSpawnWorldMany, reduced: the parent world spawns COUNT (argv[1])
copies of this script ROUNDS (argv[2]) times; each time parent and children
meet in barriers over the intercommunicator and the merged communicator,
then disconnect.  Each child prints the node it runs on and Open MPI's
shared-memory directory there."""
import os
import sys

from mpi4py import MPI

parent = MPI.Comm.Get_parent()
if parent == MPI.COMM_NULL:
    count, rounds = int(sys.argv[1]), int(sys.argv[2])
    for r in range(rounds):
        child = MPI.COMM_WORLD.Spawn(sys.executable, [__file__, "child"], count)
        merged = child.Merge(high=False)
        merged.Barrier()
        total = merged.allreduce(merged.Get_rank())
        merged.Free()
        child.Barrier()
        child.Disconnect()
        print(f"ROUND {r} size={count} total={total}", flush=True)
else:
    print(f"CHILD node={os.environ.get('PYDVM_NODE')} "
          f"vader={os.environ.get('OMPI_MCA_btl_vader_backing_directory')}", flush=True)
    merged = parent.Merge(high=True)
    merged.Barrier()
    merged.allreduce(merged.Get_rank())
    merged.Free()
    parent.Barrier()
    parent.Disconnect()
