/* Each rank prints a line on stdout (no fflush) and one on stderr; rank 0
 * then calls MPI_Abort(MPI_COMM_WORLD, 3) while the others wait.  Under
 * mpirun and under pydvm run both lines of every rank must come out, each on
 * its own stream: stdout is a terminal (isatty=1), so C's stdio has written
 * the line before the abort. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    printf("OUT rank %d isatty=%d\n", rank, isatty(1));
    fprintf(stderr, "ERR rank %d\n", rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        MPI_Abort(MPI_COMM_WORLD, 3);
    for (;;)
        sleep(1);
    return 0;
}
