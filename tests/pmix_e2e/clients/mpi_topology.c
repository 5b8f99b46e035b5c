/* MPI_Init, then one line naming this rank's process, so that a test can
 * tell which of the launcher's and the ranks' diagnostics came from a rank:
 *
 *   RANK <rank> PID <pid>
 */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    printf("RANK %d PID %d\n", rank, (int)getpid());
    MPI_Finalize();
    return 0;
}
