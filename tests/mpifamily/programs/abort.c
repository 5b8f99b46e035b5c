/* abort: after a barrier, rank 1 calls MPI_Abort(MPI_COMM_WORLD, 7); the
 * others wait for a message from rank 1 that never comes.
 *
 * Lines: "rank R ready" (each rank, after the first barrier),
 *        "rank 1 aborting" (just before MPI_Abort).
 * Nobody should print "rank R passed" -- the launcher must end them all.
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d ready\n", rank);
    fflush(stdout);
    if (rank == 1) {
        printf("rank 1 aborting\n");
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 7);
    }
    int never;
    MPI_Recv(&never, 1, MPI_INT, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    printf("rank %d passed\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
