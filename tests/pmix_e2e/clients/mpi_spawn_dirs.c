/* MPI_Comm_spawn across nodes: rank 0 of the parent job spawns N (argv[1])
 * copies of this program ("child"); each child reports the node it runs on
 * and the shared-memory directories Open MPI uses there, then the children
 * allreduce among themselves and exchange messages with the parent over the
 * intercommunicator, ROUNDS (argv[2]) times -- what collides when two
 * children on two nodes of one machine share one directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

static const char *env(const char *k)
{
    const char *v = getenv(k);
    return v ? v : "-";
}

int main(int argc, char **argv)
{
    MPI_Comm parent, inter;
    int rank, size, i, r, n, rounds, v, sum;
    static int buf[65536];
    MPI_Init(&argc, &argv);
    MPI_Comm_get_parent(&parent);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (parent == MPI_COMM_NULL) {
        n = argc > 1 ? atoi(argv[1]) : 2;
        rounds = argc > 2 ? atoi(argv[2]) : 10;
        char rs[16];
        snprintf(rs, sizeof rs, "%d", rounds);
        char *args[] = {"child", rs, NULL};
        int errs[16];
        int rc = MPI_Comm_spawn(argv[0], args, n, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter,
                                errs);
        printf("SPAWN rc=%d\n", rc);
        fflush(stdout);
        for (r = 0; r < rounds; r++) {
            for (i = 0; i < n; i++) {
                MPI_Recv(buf, 65536, MPI_INT, i, 5, inter, MPI_STATUS_IGNORE);
                MPI_Send(buf, 65536, MPI_INT, i, 6, inter);
            }
        }
        printf("PARENT rounds=%d\n", rounds);
        MPI_Comm_disconnect(&inter);
    } else {
        rounds = argc > 2 ? atoi(argv[2]) : 10;
        printf("CHILD rank=%d size=%d node=%s vader=%s tmpdir=%s files=%s\n", rank, size,
               env("PYDVM_NODE"), env("OMPI_MCA_btl_vader_backing_directory"),
               env("OMPI_MCA_orte_tmpdir_base"), env("OMPI_FILE_LOCATION"));
        fflush(stdout);
        for (r = 0; r < rounds; r++) {
            v = rank + r;
            MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            for (i = 0; i < 65536; i++)
                buf[i] = sum;
            MPI_Send(buf, 65536, MPI_INT, 0, 5, parent);
            MPI_Recv(buf, 65536, MPI_INT, 0, 6, parent, MPI_STATUS_IGNORE);
            if (buf[65535] != sum)
                printf("CHILD rank=%d BAD round=%d\n", rank, r);
        }
        printf("CHILD rank=%d DONE sum=%d\n", rank, sum);
        fflush(stdout);
        MPI_Comm_disconnect(&parent);
    }
    MPI_Finalize();
    return 0;
}
