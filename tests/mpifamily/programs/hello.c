/* hello: each rank prints who and where it is, then an allreduce of the
 * ranks is checked against N(N-1)/2.
 *
 * Lines (one per rank unless said):
 *   rank R of N on HOST
 *   init_s=SECONDS          (with --timing: MPI_Init's wall time, rank 0 only)
 *   sum ok                  (rank 0, when the allreduce is right)
 * A wrong sum prints "sum wrong: GOT != WANT" and exits 2.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

static double now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec * 1e-6;
}

int main(int argc, char **argv)
{
    int timing = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--timing") == 0)
            timing = 1;
    /* MPI_Wtime cannot be called before MPI_Init: the clock before it is
     * the system's, and so is the one after, for one measure. */
    double t0 = now();
    MPI_Init(&argc, &argv);
    double t1 = now();
    int rank, size, len;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    long mine = rank, sum = -1;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long want = (long)size * (size - 1) / 2;
    if (sum != want) {
        printf("sum wrong: %ld != %ld\n", sum, want);
        fflush(stdout);
        return 2;
    }
    if (timing) {
        double mine_s = t1 - t0, max_s = 0;
        MPI_Reduce(&mine_s, &max_s, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0)
            printf("init_s=%.6f\n", max_s);
    }
    if (rank == 0)
        printf("sum ok\n");
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
