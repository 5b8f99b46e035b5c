/* spawn: the parent job (any size) spawns 2 children running this same
 * program; the two groups exchange over the intercommunicator.
 *
 * Each parent rank contributes 100+rank and each child 1000+rank to an
 * allreduce over the intercommunicator, so a parent receives the children's
 * sum (2001) and a child the parents' (100*P + P(P-1)/2); then the groups
 * merge and check the merged size is P+2.
 *
 * Lines: "parent R of P got 2001 ok", "child R of 2 parents P got S ok",
 *        "merged size M ok" (rank 0 of the merged group), "parent done"
 *        (parent rank 0).  A failure prints "FAIL: ..." and exits 1.
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm parent, inter;
    MPI_Comm_get_parent(&parent);
    int is_parent = parent == MPI_COMM_NULL;
    if (is_parent) {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            printf("FAIL: readlink /proc/self/exe\n");
            return 1;
        }
        self[n] = 0;
        int errs[2] = {-1, -1};
        char *args[] = {"child", NULL};
        check(MPI_Comm_spawn(self, args, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, errs),
              "MPI_Comm_spawn");
        for (int i = 0; i < 2; i++)
            check(errs[i], "MPI_Comm_spawn's error code");
    } else {
        inter = parent;
        MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    }
    int remote;
    MPI_Comm_remote_size(inter, &remote);
    int mine = (is_parent ? 100 : 1000) + rank, got = -1;
    check(MPI_Allreduce(&mine, &got, 1, MPI_INT, MPI_SUM, inter), "MPI_Allreduce (inter)");
    int want = is_parent ? 2001 : 100 * remote + remote * (remote - 1) / 2;
    if (got != want) {
        printf("FAIL: %s %d got %d, not %d\n", is_parent ? "parent" : "child", rank, got, want);
        fflush(stdout);
        return 1;
    }
    if (is_parent)
        printf("parent %d of %d got %d ok\n", rank, size, got);
    else
        printf("child %d of %d parents %d got %d ok\n", rank, size, remote, got);
    fflush(stdout);
    MPI_Comm merged;
    check(MPI_Intercomm_merge(inter, is_parent ? 0 : 1, &merged), "MPI_Intercomm_merge");
    int msize, mrank;
    MPI_Comm_size(merged, &msize);
    MPI_Comm_rank(merged, &mrank);
    int pcount = is_parent ? size : remote;
    if (msize != pcount + 2) {
        printf("FAIL: merged size %d, not %d\n", msize, pcount + 2);
        fflush(stdout);
        return 1;
    }
    if (mrank == 0)
        printf("merged size %d ok\n", msize);
    fflush(stdout);
    MPI_Comm_free(&merged);
    check(MPI_Comm_disconnect(&inter), "MPI_Comm_disconnect");
    if (is_parent && rank == 0)
        printf("parent done\n");
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
