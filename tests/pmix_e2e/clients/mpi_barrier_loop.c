/* MPI_Barrier in a loop: N (argv[1], default 1000) barriers, then rank 0
 * prints the mean time of one in microseconds and what Open MPI was told
 * about oversubscription. */
#include <stdio.h>
#include <stdlib.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    int rank, size, i, n = argc > 1 ? atoi(argv[1]) : 1000;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (i = 0; i < n; i++)
        MPI_Barrier(MPI_COMM_WORLD);
    double us = (MPI_Wtime() - t0) * 1e6 / n;
    if (rank == 0) {
        const char *o = getenv("OMPI_MCA_mpi_oversubscribe");
        printf("BARRIER size=%d n=%d us=%.1f oversubscribe=%s\n", size, n, us, o ? o : "-");
    }
    MPI_Finalize();
    return 0;
}
