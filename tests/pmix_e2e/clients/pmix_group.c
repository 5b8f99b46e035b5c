/* PMIx groups, driven by its arguments (run in order after PMIx_Init):
 *
 *   put                       PMIx_Put "grp.data" = 100 + rank (GLOBAL), PMIx_Commit
 *   construct:NAME[:ctxid]    PMIx_Group_construct of every rank of this job
 *                             (":ctxid" asks for PMIX_GROUP_ASSIGN_CONTEXT_ID)
 *   get:RANK                  PMIx_Get of RANK's "grp.data"
 *   destruct:NAME             PMIx_Group_destruct
 *   exit:RANK:STATUS          rank RANK exits here with STATUS (without finalize)
 *   sleep:MS
 *
 * Prints one line per operation, e.g.
 *   CONSTRUCT status=0 ctxid=3   (ctxid=- when none was given)
 *   GET rank=1 status=0 value=101
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    pmix_proc_t me, job, *members;
    pmix_value_t *v = NULL;
    uint32_t size = 0, r;
    int i;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    printf("INIT status=%d rank=%u\n", rc, me.rank);
    fflush(stdout);
    if (rc != PMIX_SUCCESS) return 1;
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &v) == PMIX_SUCCESS) {
        size = v->data.uint32;
        PMIX_VALUE_RELEASE(v);
    }
    members = calloc(size ? size : 1, sizeof(pmix_proc_t));
    for (r = 0; r < size; r++) PMIX_LOAD_PROCID(&members[r], me.nspace, r);
    for (i = 1; i < argc; i++) {
        char *arg = strdup(argv[i]);
        char *op = strtok(arg, ":");
        if (!strcmp(op, "put")) {
            pmix_value_t val;
            PMIX_VALUE_LOAD(&val, &(uint32_t){100 + me.rank}, PMIX_UINT32);
            rc = PMIx_Put(PMIX_GLOBAL, "grp.data", &val);
            if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
            printf("PUT status=%d\n", rc);
        } else if (!strcmp(op, "construct")) {
            char *name = strtok(NULL, ":"), *flag = strtok(NULL, ":");
            pmix_info_t info[1], *results = NULL;
            size_t ninfo = 0, nresults = 0, n;
            char ctx[32] = "-";
            bool t = true;
            if (flag && !strcmp(flag, "ctxid")) {
                PMIX_INFO_LOAD(&info[0], PMIX_GROUP_ASSIGN_CONTEXT_ID, &t, PMIX_BOOL);
                ninfo = 1;
            }
            rc = PMIx_Group_construct(name, members, size, ninfo ? info : NULL, ninfo, &results,
                                      &nresults);
            for (n = 0; n < nresults; n++) {
                if (PMIX_CHECK_KEY(&results[n], PMIX_GROUP_CONTEXT_ID)) {
                    size_t id = 0;
                    pmix_status_t got;
                    PMIX_VALUE_GET_NUMBER(got, &results[n].value, id, size_t);
                    if (got == PMIX_SUCCESS) snprintf(ctx, sizeof ctx, "%zu", id);
                }
            }
            printf("CONSTRUCT status=%d ctxid=%s\n", rc, ctx);
        } else if (!strcmp(op, "get")) {
            pmix_proc_t p;
            r = (uint32_t)atoi(strtok(NULL, ":"));
            PMIX_LOAD_PROCID(&p, me.nspace, r);
            v = NULL;
            rc = PMIx_Get(&p, "grp.data", NULL, 0, &v);
            printf("GET rank=%u status=%d value=%u\n", r, rc,
                   rc == PMIX_SUCCESS && v ? v->data.uint32 : 0);
            if (v) PMIX_VALUE_RELEASE(v);
        } else if (!strcmp(op, "destruct")) {
            rc = PMIx_Group_destruct(strtok(NULL, ":"), NULL, 0);
            printf("DESTRUCT status=%d\n", rc);
        } else if (!strcmp(op, "exit")) {
            int rank = atoi(strtok(NULL, ":")), st = atoi(strtok(NULL, ":"));
            if ((int)me.rank == rank) {
                printf("EXITING status=%d\n", st);
                fflush(stdout);
                _exit(st);
            }
        } else if (!strcmp(op, "sleep")) {
            usleep(1000 * atoi(strtok(NULL, ":")));
        }
        fflush(stdout);
        free(arg);
    }
    rc = PMIx_Finalize(NULL, 0);
    printf("DONE status=%d\n", rc);
    return 0;
}
