/* MPI_Win_allocate_shared over MPI_COMM_WORLD (errors returned, not fatal):
 * "WIN rank=R rc=0 sum=S" where every rank wrote its rank into its part and
 * rank 0 read them all, or "WIN rank=R rc=ERRCLASS". */
#include <stdio.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    int rank, size, rc, cls, i, sum = 0, *mine, *peer, du;
    MPI_Aint sz;
    MPI_Win win;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    rc = MPI_Win_allocate_shared(sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD,
                                 &mine, &win);
    if (rc != MPI_SUCCESS) {
        MPI_Error_class(rc, &cls);
        printf("WIN rank=%d rc=%d\n", rank, cls);
        MPI_Finalize();
        return 0;
    }
    *mine = rank;
    MPI_Win_fence(0, win);
    if (rank == 0)
        for (i = 0; i < size; i++) {
            MPI_Win_shared_query(win, i, &sz, &du, &peer);
            sum += *peer;
        }
    MPI_Win_fence(0, win);
    printf("WIN rank=%d rc=0 sum=%d\n", rank, sum);
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
