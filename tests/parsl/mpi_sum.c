/* mpi_sum: each rank says which DVM node it is on, and the ranks add up
 * their rank numbers with MPI_Allreduce.  One line a rank:
 *   rank R of N on NODE sum S via IFACE
 * NODE: $PYDVM_NODE, the DVM's name for the node (the local nodes of a
 * test all share this machine's hostname); IFACE: the interface the rank
 * was given -- pmi1 (PMI_FD or PMI_PORT, no PMIx), pmix (PMIx, no PMI-1),
 * both, or none. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size, sum = -1;
    const char *node = getenv("PYDVM_NODE");
    int pmi1 = getenv("PMI_FD") != NULL || getenv("PMI_PORT") != NULL;
    int pmix = getenv("PMIX_NAMESPACE") != NULL;
    const char *iface = pmi1 ? (pmix ? "both" : "pmi1") : (pmix ? "pmix" : "none");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s sum %d via %s\n", rank, size, node ? node : "?", sum, iface);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
