/* MPI_INFO_ENV and MPI_UNIVERSE_SIZE as Open MPI fills them from the
 * launcher's environment: one line per key, "INFO rank=R key=value" or
 * "key=Not found". */
#include <stdio.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    static const char *keys[] = {"command", "argv", "maxprocs", "soft", "wdir",
                                 "ompi_num_apps", "ompi_first_rank", "ompi_np",
                                 "ompi_positioned_file_dir", NULL};
    char val[4096];
    int rank, flag, i, appnum = -1, *usize;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (i = 0; keys[i]; i++) {
        MPI_Info_get(MPI_INFO_ENV, keys[i], sizeof val - 1, val, &flag);
        printf("INFO rank=%d %s=%s\n", rank, keys[i], flag ? val : "Not found");
    }
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_UNIVERSE_SIZE, &usize, &flag);
    printf("INFO rank=%d universe_size=%d\n", rank, flag ? *usize : -1);
    int *an;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &an, &flag);
    if (flag)
        appnum = *an;
    printf("INFO rank=%d appnum=%d\n", rank, appnum);
    MPI_Finalize();
    return 0;
}
