/* Open MPI side of bench/pmix/pmix.py: holds HELD names with MPI_Publish_name,
 * then times ITERS MPI_Publish_name calls (fresh names) and ITERS
 * MPI_Lookup_name calls (held names), printing every sample in
 * microseconds, one line per operation kind (as pmix_bench_client.c). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <mpi.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    int held = atoi(argv[1]), iters = atoi(argv[2]), i, rc;
    char name[64], port[MPI_MAX_PORT_NAME] = "some-port-string-of-moderate-length";
    char found[MPI_MAX_PORT_NAME];
    double *pub = malloc(sizeof(double) * iters), *lk = malloc(sizeof(double) * iters), t;
    MPI_Init(&argc, &argv);
    for (i = 0; i < held; i++) {
        snprintf(name, sizeof name, "held-%d", i);
        if ((rc = MPI_Publish_name(name, MPI_INFO_NULL, port))) {
            fprintf(stderr, "prefill publish %d\n", rc);
            return 2;
        }
    }
    for (i = 0; i < iters; i++) {
        snprintf(name, sizeof name, "fresh-%d", i);
        t = now_us();
        rc = MPI_Publish_name(name, MPI_INFO_NULL, port);
        pub[i] = now_us() - t;
        if (rc) { fprintf(stderr, "publish %d\n", rc); return 3; }
    }
    for (i = 0; i < iters; i++) {
        snprintf(name, sizeof name, "held-%d", (i * 7919) % (held ? held : 1));
        t = now_us();
        rc = MPI_Lookup_name(name, MPI_INFO_NULL, found);
        lk[i] = now_us() - t;
        if (rc) { fprintf(stderr, "lookup %d\n", rc); return 4; }
    }
    printf("PUBLISH");
    for (i = 0; i < iters; i++) printf(" %.1f", pub[i]);
    printf("\nLOOKUP");
    for (i = 0; i < iters; i++) printf(" %.1f", lk[i]);
    printf("\n");
    /* unpublish everything so mpirun's data server ends empty */
    for (i = 0; i < held; i++) {
        snprintf(name, sizeof name, "held-%d", i);
        MPI_Unpublish_name(name, MPI_INFO_NULL, port);
    }
    for (i = 0; i < iters; i++) {
        snprintf(name, sizeof name, "fresh-%d", i);
        MPI_Unpublish_name(name, MPI_INFO_NULL, port);
    }
    MPI_Finalize();
    return 0;
}
