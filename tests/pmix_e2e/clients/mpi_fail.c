/* An MPI job one rank of which fails while the others wait in a collective.
 *
 *   mpi_fail RANK HOW     HOW: exit:N (exit N after MPI_Init), nofin (return 0
 *                         without MPI_Finalize), abort:N (MPI_Abort(COMM_WORLD, N)),
 *                         kill (SIGKILL itself), none (nobody fails)
 *
 * Every rank prints "UP rank=R" after MPI_Init (stdout, not flushed: a
 * pseudo-terminal makes it line-buffered), then the failing rank fails and
 * the others enter MPI_Barrier; survivors print "PAST rank=R".
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, who = argc > 1 ? atoi(argv[1]) : -1;
    const char *how = argc > 2 ? argv[2] : "none";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    printf("UP rank=%d\n", rank);
    fflush(stdout);
    if (rank == who) {
        usleep(200000);
        if (!strncmp(how, "exit:", 5)) exit(atoi(how + 5));
        if (!strcmp(how, "nofin")) return 0;
        if (!strncmp(how, "abort:", 6)) MPI_Abort(MPI_COMM_WORLD, atoi(how + 6));
        if (!strcmp(how, "kill")) kill(getpid(), SIGKILL);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("PAST rank=%d\n", rank);
    MPI_Finalize();
    return 0;
}
