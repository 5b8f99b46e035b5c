/* names: MPI's name service alone, no ports (MPICH's ch4:ucx cannot open one).
 *
 *   names publish SERVICE VALUE   -- MPI_Publish_name, then waits for a line on
 *                                    stdin (or EOF) and MPI_Unpublish_name
 *   names lookup SERVICE          -- MPI_Lookup_name once
 *
 * Lines: "published SERVICE", "unpublished SERVICE", "found SERVICE VALUE",
 *        "missing SERVICE" (lookup failed: exit 3), "FAIL: WHAT" (exit 1).
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: names publish SERVICE VALUE | lookup SERVICE\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int rc = 0;
    if (strcmp(argv[1], "publish") == 0 && argc > 3) {
        if (MPI_Publish_name(argv[2], MPI_INFO_NULL, argv[3]) != MPI_SUCCESS) {
            printf("FAIL: publish\n");
            rc = 1;
        } else {
            printf("published %s\n", argv[2]);
            fflush(stdout);
            char line[64];
            if (!fgets(line, sizeof line, stdin))
                line[0] = 0;
            if (MPI_Unpublish_name(argv[2], MPI_INFO_NULL, argv[3]) != MPI_SUCCESS) {
                printf("FAIL: unpublish\n");
                rc = 1;
            } else
                printf("unpublished %s\n", argv[2]);
        }
    } else {
        char port[MPI_MAX_PORT_NAME] = "";
        if (MPI_Lookup_name(argv[2], MPI_INFO_NULL, port) != MPI_SUCCESS) {
            printf("missing %s\n", argv[2]);
            rc = 3;
        } else
            printf("found %s %s\n", argv[2], port);
    }
    fflush(stdout);
    MPI_Finalize();
    return rc;
}
