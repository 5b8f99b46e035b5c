/* One job of an accept/connect pair: opens a port, publishes it under a
 * service name, accepts one connection from another job, sends it 42 and
 * waits for its answer, then unpublishes and disconnects. */
#include <stdio.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    char port[MPI_MAX_PORT_NAME];
    const char *svc = argc > 1 ? argv[1] : "pydvm-e2e-svc";
    int rank, rc, val = 42, back = 0;
    MPI_Comm inter;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Open_port(MPI_INFO_NULL, port);
    rc = MPI_Publish_name(svc, MPI_INFO_NULL, port);
    printf("PUBLISHED rc=%d\n", rc);
    fflush(stdout);
    rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
    printf("ACCEPT rc=%d\n", rc);
    fflush(stdout);
    MPI_Send(&val, 1, MPI_INT, 0, 7, inter);
    MPI_Recv(&back, 1, MPI_INT, 0, 8, inter, MPI_STATUS_IGNORE);
    printf("GOT back=%d\n", back);
    MPI_Unpublish_name(svc, MPI_INFO_NULL, port);
    MPI_Comm_disconnect(&inter);
    MPI_Close_port(port);
    MPI_Finalize();
    printf("DONE\n");
    return 0;
}
