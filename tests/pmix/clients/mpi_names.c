/* MPI_Init, then rank 0 publishes a service name, every rank looks it up,
 * rank 0 unpublishes it, every rank checks it is gone; MPI_Finalize. */
#include <stdio.h>
#include <string.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    int rank, size, rc, len, appnum = -1, flag = 0, *ap;
    char port[MPI_MAX_PORT_NAME], found[MPI_MAX_PORT_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &ap, &flag);
    if (flag) appnum = *ap;
    printf("INIT rank=%d size=%d appnum=%d\n", rank, size, appnum);
    fflush(stdout);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (rank == 0) {
        snprintf(port, sizeof(port), "port-of-rank-0");
        rc = MPI_Publish_name("pydvm-svc", MPI_INFO_NULL, port);
        printf("PUBLISH rc=%d\n", rc);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    rc = MPI_Lookup_name("pydvm-svc", MPI_INFO_NULL, found);
    printf("LOOKUP rc=%d port=%s\n", rc, rc == MPI_SUCCESS ? found : "-");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        rc = MPI_Unpublish_name("pydvm-svc", MPI_INFO_NULL, port);
        printf("UNPUBLISH rc=%d\n", rc);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    rc = MPI_Lookup_name("pydvm-svc", MPI_INFO_NULL, found);
    MPI_Error_class(rc, &len);
    printf("LOOKUP2 rc=%d class=%d\n", rc, len);
    /* the MPI_Info keys Open MPI turns into PMIx range / persistence */
    {
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "range", "nspace");
        if (rank == 0) {
            MPI_Info_set(info, "persistence", "app");
            rc = MPI_Publish_name("pydvm-svc2", info, port);
            printf("PUBLISH2 rc=%d\n", rc);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Info_delete(info, "persistence");
        rc = MPI_Lookup_name("pydvm-svc2", info, found);
        printf("LOOKUP3 rc=%d port=%s\n", rc, rc == MPI_SUCCESS ? found : "-");
        MPI_Info_free(&info);
    }
    MPI_Finalize();
    printf("FINALIZE rank=%d\n", rank);
    return 0;
}
