/* MPI_Comm_spawn: run without arguments, rank 0 of the parent job spawns
 * N (argv[1], default 2) copies of this program with the argument "child";
 * each child sends its rank to the parent over the intercommunicator. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    MPI_Comm parent, inter;
    int rank, size, i, n, v, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_get_parent(&parent);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (parent == MPI_COMM_NULL) {
        char *args[] = {"child", NULL};
        int errs[16];
        n = argc > 1 ? atoi(argv[1]) : 2;
        int rc = MPI_Comm_spawn(argv[0], args, n, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter,
                                errs);
        printf("SPAWN rc=%d\n", rc);
        fflush(stdout);
        for (i = 0; i < n; i++) {
            MPI_Recv(&v, 1, MPI_INT, i, 5, inter, MPI_STATUS_IGNORE);
            sum += v + 1;
        }
        printf("PARENT sum=%d\n", sum);
        MPI_Comm_disconnect(&inter);
    } else {
        printf("CHILD rank=%d size=%d\n", rank, size);
        fflush(stdout);
        MPI_Send(&rank, 1, MPI_INT, 0, 5, parent);
        MPI_Comm_disconnect(&parent);
    }
    MPI_Finalize();
    return 0;
}
