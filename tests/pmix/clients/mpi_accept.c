/* MPI_Comm_accept / MPI_Comm_connect between rank 0 and rank 1 of one job,
 * each on MPI_COMM_SELF: Open MPI publishes and looks up its connection
 * data through PMIx (FIRST_READ persistence, PMIX_WAIT) and calls
 * PMIx_Connect. */
#include <stdio.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    int rank, rc, val = 0;
    char port[MPI_MAX_PORT_NAME];
    MPI_Comm inter;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        MPI_Open_port(MPI_INFO_NULL, port);
        rc = MPI_Publish_name("pydvm-accept", MPI_INFO_NULL, port);
        printf("PUBLISH rc=%d\n", rc);
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
        rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        printf("ACCEPT rc=%d\n", rc);
        val = 42;
        MPI_Send(&val, 1, MPI_INT, 0, 7, inter);
        MPI_Unpublish_name("pydvm-accept", MPI_INFO_NULL, port);
        MPI_Close_port(port);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        rc = MPI_Lookup_name("pydvm-accept", MPI_INFO_NULL, port);
        printf("LOOKUP rc=%d\n", rc);
        rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        printf("CONNECT rc=%d\n", rc);
        MPI_Recv(&val, 1, MPI_INT, 0, 7, inter, MPI_STATUS_IGNORE);
        printf("RECV val=%d\n", val);
    }
    fflush(stdout);
    MPI_Comm_disconnect(&inter);
    printf("DISCONNECT rank=%d\n", rank);
    MPI_Finalize();
    printf("FINALIZE rank=%d\n", rank);
    return 0;
}
