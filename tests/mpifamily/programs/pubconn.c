/* pubconn: MPI's name service and dynamic connection.
 *
 *   pubconn server   -- MPI_Open_port, MPI_Publish_name("pydvm-test-svc"),
 *                       MPI_Comm_accept, exchange a value, MPI_Unpublish_name
 *   pubconn client   -- MPI_Lookup_name("pydvm-test-svc") (retried until it is
 *                       published, at most 60 s), MPI_Comm_connect, exchange
 *
 * Works as two jobs, or as two apps of one job (mpiexec -n 1 pubconn server
 * : -n 1 pubconn client): the ranks of one role are those of the same
 * MPI_APPNUM.  A third argument names the service instead of the default.
 *
 * Lines: "server published PORT", "client looked up PORT",
 *        "server got 2000 ok", "client got 1000 ok", "server unpublished",
 *        "ROLE done".  A failure prints "FAIL: WHAT: MPI's error string"
 *        and exits 1.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    printf("FAIL: %s: %s\n", what, msg);
    fflush(stdout);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: pubconn server|client [SERVICE]\n");
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0;
    const char *service = argc > 2 ? argv[2] : "pydvm-test-svc";
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);

    int *appnum, flag = 0, rank;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    MPI_Comm app;
    MPI_Comm_split(MPI_COMM_WORLD, flag ? *appnum : 0, 0, &app);
    MPI_Comm_rank(app, &rank);

    char port[MPI_MAX_PORT_NAME] = "";
    MPI_Comm inter;
    if (server) {
        if (rank == 0) {
            check(MPI_Open_port(MPI_INFO_NULL, port), "MPI_Open_port");
            check(MPI_Publish_name(service, MPI_INFO_NULL, port), "MPI_Publish_name");
            printf("server published %s\n", port);
            fflush(stdout);
        }
        check(MPI_Comm_accept(port, MPI_INFO_NULL, 0, app, &inter), "MPI_Comm_accept");
    } else {
        if (rank == 0) {
            int rc = MPI_ERR_NAME;
            for (int i = 0; i < 600; i++) {
                rc = MPI_Lookup_name(service, MPI_INFO_NULL, port);
                if (rc == MPI_SUCCESS)
                    break;
                struct timespec ts = {0, 100 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            check(rc, "MPI_Lookup_name");
            printf("client looked up %s\n", port);
            fflush(stdout);
        }
        check(MPI_Comm_connect(port, MPI_INFO_NULL, 0, app, &inter), "MPI_Comm_connect");
    }
    int mine = server ? 1000 : 2000, theirs = -1, want = server ? 2000 : 1000;
    if (rank == 0) {
        MPI_Status st;
        check(MPI_Sendrecv(&mine, 1, MPI_INT, 0, 5, &theirs, 1, MPI_INT, 0, 5, inter, &st),
              "MPI_Sendrecv");
        if (theirs != want) {
            printf("FAIL: %s got %d, not %d\n", argv[1], theirs, want);
            fflush(stdout);
            exit(1);
        }
        printf("%s got %d ok\n", argv[1], theirs);
        fflush(stdout);
    }
    check(MPI_Comm_disconnect(&inter), "MPI_Comm_disconnect");
    if (server && rank == 0) {
        check(MPI_Unpublish_name(service, MPI_INFO_NULL, port), "MPI_Unpublish_name");
        check(MPI_Close_port(port), "MPI_Close_port");
        printf("server unpublished\n");
    }
    if (rank == 0)
        printf("%s done\n", argv[1]);
    fflush(stdout);
    MPI_Comm_free(&app);
    MPI_Finalize();
    return 0;
}
