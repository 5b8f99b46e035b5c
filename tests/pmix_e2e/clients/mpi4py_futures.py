"""mpi4py.futures: an MPIPoolExecutor spawns its workers with MPI_Comm_spawn."""
from mpi4py.futures import MPIPoolExecutor

if __name__ == "__main__":
    with MPIPoolExecutor(max_workers=2) as ex:
        print("RESULTS", list(ex.map(pow, [2, 3, 4], [5, 2, 3])), flush=True)
    print("POOL DONE", flush=True)
