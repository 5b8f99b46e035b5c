/* PMIx client for bench/pmix/pmix_host.py: holds HELD names, then times ITERS
 * PMIx_Publish calls (fresh keys) and ITERS PMIx_Lookup calls (held keys),
 * printing one line per operation kind with every sample in microseconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pmix.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int publish(const char *key, const char *val)
{
    pmix_info_t info;
    PMIX_INFO_LOAD(&info, key, val, PMIX_STRING);
    int rc = PMIx_Publish(&info, 1);
    PMIX_INFO_DESTRUCT(&info);
    return rc;
}

int main(int argc, char **argv)
{
    pmix_proc_t me;
    int held = atoi(argv[1]), iters = atoi(argv[2]), i, rc;
    /* "publish" as a third argument: time publishes only (no lookups). */
    int lookups = !(argc > 3 && 0 == strcmp(argv[3], "publish"));
    char key[64];
    double *pub = malloc(sizeof(double) * iters), *lk = malloc(sizeof(double) * iters), t;
    if (PMIX_SUCCESS != PMIx_Init(&me, NULL, 0)) return 1;
    for (i = 0; i < held; i++) {
        snprintf(key, sizeof key, "held-%d", i);
        if ((rc = publish(key, "some-port-string-of-moderate-length"))) {
            fprintf(stderr, "prefill publish %d\n", rc);
            return 2;
        }
    }
    for (i = 0; i < iters; i++) {
        snprintf(key, sizeof key, "fresh-%d", i);
        t = now_us();
        rc = publish(key, "some-port-string-of-moderate-length");
        pub[i] = now_us() - t;
        if (rc) { fprintf(stderr, "publish %d\n", rc); return 3; }
    }
    for (i = 0; lookups && i < iters; i++) {
        pmix_pdata_t pd;
        PMIX_PDATA_CONSTRUCT(&pd);
        snprintf(key, sizeof key, "held-%d", (i * 7919) % (held ? held : 1));
        pmix_strncpy(pd.key, key, PMIX_MAX_KEYLEN);
        t = now_us();
        rc = PMIx_Lookup(&pd, 1, NULL, 0);
        lk[i] = now_us() - t;
        PMIX_PDATA_DESTRUCT(&pd);
        if (rc) { fprintf(stderr, "lookup %d\n", rc); return 4; }
    }
    printf("PUBLISH");
    for (i = 0; i < iters; i++) printf(" %.1f", pub[i]);
    if (lookups) {
        printf("\nLOOKUP");
        for (i = 0; i < iters; i++) printf(" %.1f", lk[i]);
    }
    printf("\n");
    PMIx_Finalize(NULL, 0);
    return 0;
}
