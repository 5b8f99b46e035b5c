/* The other job of an accept/connect pair: looks the service name up,
 * connects, receives 42 and answers 43. */
#include <stdio.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    char port[MPI_MAX_PORT_NAME];
    const char *svc = argc > 1 ? argv[1] : "pydvm-e2e-svc";
    int rc, val = 0, back = 43;
    MPI_Comm inter;
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    rc = MPI_Lookup_name(svc, MPI_INFO_NULL, port);
    printf("LOOKUP rc=%d\n", rc);
    fflush(stdout);
    if (rc != MPI_SUCCESS) { MPI_Finalize(); return 3; }
    rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
    printf("CONNECT rc=%d\n", rc);
    fflush(stdout);
    MPI_Recv(&val, 1, MPI_INT, 0, 7, inter, MPI_STATUS_IGNORE);
    printf("RECV val=%d\n", val);
    MPI_Send(&back, 1, MPI_INT, 0, 8, inter);
    MPI_Comm_disconnect(&inter);
    MPI_Finalize();
    printf("DONE\n");
    return 0;
}
