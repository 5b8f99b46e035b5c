"""mpi4py name service, driven by its arguments (one operation each, rank 0 only):

    pub:NAME:PORT[:PERSISTENCE]   MPI.Publish_name (MPI_Info "persistence" if given)
    look:NAME                     MPI.Lookup_name: FOUND NAME PORT, or LOOKUP NAME class=N
    unpub:NAME:PORT               MPI.Unpublish_name
    sleep:SECONDS
"""
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
print(f"INIT rank={comm.Get_rank()} size={comm.Get_size()}", flush=True)
if comm.Get_rank() == 0:
    for op in sys.argv[1:]:
        name, _, rest = op.partition(":")
        args = rest.split(":")
        try:
            if name == "pub":
                info = MPI.Info.Create()
                if len(args) > 2:
                    info.Set("persistence", args[2])
                MPI.Publish_name(args[0], args[1], info)
                print(f"PUBLISHED {args[0]}", flush=True)
            elif name == "look":
                print(f"FOUND {args[0]} {MPI.Lookup_name(args[0])}", flush=True)
            elif name == "unpub":
                MPI.Unpublish_name(args[0], args[1])
                print(f"UNPUBLISHED {args[0]}", flush=True)
            elif name == "sleep":
                time.sleep(float(args[0]))
        except MPI.Exception as e:
            print(f"{name.upper()} {args[0]} class={e.Get_error_class()}", flush=True)
comm.Barrier()
MPI.Finalize()
print("FINALIZED", flush=True)
