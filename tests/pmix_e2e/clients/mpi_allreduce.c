/* MPI_Allreduce over the world, with a payload large enough for Open MPI's
 * shared-memory transport to carry it between ranks of one node. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    static double data[1 << 16], sum[1 << 16];
    int rank, size, i;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (i = 0; i < (1 << 16); i++) data[i] = rank;
    MPI_Allreduce(data, sum, 1 << 16, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    printf("ALLREDUCE rank=%d size=%d sum=%.0f\n", rank, size, sum[12345]);
    MPI_Finalize();
    return 0;
}
