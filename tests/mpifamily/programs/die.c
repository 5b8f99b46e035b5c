/* die: after a barrier, rank 1 leaves without MPI_Finalize -- exit(3), or
 * with --signal it kills itself with SIGKILL; the others block in an
 * allreduce that cannot complete.
 *
 * Lines: "rank R ready" (each rank), "rank 1 dying" (just before).
 * Nobody should print "rank R passed".
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, by_signal = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--signal") == 0)
            by_signal = 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d ready\n", rank);
    fflush(stdout);
    if (rank == 1) {
        printf("rank 1 dying\n");
        fflush(stdout);
        if (by_signal)
            kill(getpid(), SIGKILL);
        _exit(3);
    }
    int mine = rank, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d passed\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
