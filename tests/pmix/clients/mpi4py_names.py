"""mpi4py under a pydvm.pmix host: publish/lookup/unpublish a service name."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
print(f"INIT rank={rank} size={size}", flush=True)
if rank == 0:
    MPI.Publish_name("pydvm-py-svc", "py-port-0")
    print("PUBLISH ok", flush=True)
comm.Barrier()
print(f"LOOKUP port={MPI.Lookup_name('pydvm-py-svc')}", flush=True)
comm.Barrier()
if rank == 0:
    MPI.Unpublish_name("pydvm-py-svc", "py-port-0")
    print("UNPUBLISH ok", flush=True)
comm.Barrier()
try:
    MPI.Lookup_name("pydvm-py-svc")
    print("LOOKUP2 found", flush=True)
except MPI.Exception as e:
    print(f"LOOKUP2 error_class={e.Get_error_class()}", flush=True)
# an allgather through the fence path exercises the modex data
print(f"ALLGATHER {comm.allgather(rank * 10)}", flush=True)
MPI.Finalize()
print(f"FINALIZE rank={rank}", flush=True)
