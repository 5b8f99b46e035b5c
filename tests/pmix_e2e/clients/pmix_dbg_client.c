/* A PMIx client for debugger tests: says when it starts, when PMIx_Init has
 * returned (after a debugger's release, for a job started stopped in init)
 * and when it is done.
 *
 *   START pid=P                  before PMIx_Init
 *   INIT status=S rank=R         once PMIx_Init returned
 *   DONE rank=R                  after PMIx_Finalize
 *
 * With a directory as argument it also creates DIR/init.RANK once
 * PMIx_Init returned (for jobs whose output nobody forwards: a tool's).
 * Lines are flushed at once.  Exits 1 when PMIx_Init fails.
 */
#include <pmix.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    pmix_proc_t me;
    pmix_status_t rc;
    printf("START pid=%d\n", (int)getpid());
    fflush(stdout);
    rc = PMIx_Init(&me, NULL, 0);
    printf("INIT status=%d rank=%u\n", rc, rc == PMIX_SUCCESS ? me.rank : 0u);
    fflush(stdout);
    if (rc != PMIX_SUCCESS)
        return 1;
    if (argc > 1) {
        char path[4096];
        FILE *f;
        snprintf(path, sizeof path, "%s/init.%u", argv[1], me.rank);
        f = fopen(path, "w");
        if (f != NULL) {
            fprintf(f, "%s\n", me.nspace);
            fclose(f);
        }
    }
    PMIx_Finalize(NULL, 0);
    printf("DONE rank=%u\n", me.rank);
    fflush(stdout);
    return 0;
}
