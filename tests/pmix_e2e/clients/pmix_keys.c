/* Reads the job-, node-, application- and process-level keys PMIx and MPI
 * programs commonly ask for, through the client's default data store, and
 * prints one line per key:
 *
 *   R<rank> <WHAT> <key>=<value>        found
 *   R<rank> <WHAT> <key> ERR <status>   not found (or another error)
 *
 * WHAT: JOB ({nspace, WILDCARD}), PROC (the rank itself), PEER0 (rank 0),
 * APP<n> (job-level with the PMIX_APP_INFO qualifier for app n).
 * Argument (optional): the number of applications to ask about (default 1).
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void show(const char *what, const pmix_proc_t *p, const char *key,
                 const pmix_info_t *info, size_t ninfo)
{
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(p, key, info, ninfo, &v);
    if (rc != PMIX_SUCCESS) {
        printf("%s %s ERR %s\n", what, key, PMIx_Error_string(rc));
        return;
    }
    switch (v->type) {
    case PMIX_STRING: printf("%s %s=%s\n", what, key, v->data.string); break;
    case PMIX_UINT32: printf("%s %s=%u\n", what, key, v->data.uint32); break;
    case PMIX_UINT16: printf("%s %s=%u\n", what, key, v->data.uint16); break;
    case PMIX_PROC_RANK: printf("%s %s=%u\n", what, key, v->data.rank); break;
    case PMIX_INT: printf("%s %s=%d\n", what, key, v->data.integer); break;
    case PMIX_BOOL: printf("%s %s=%d\n", what, key, v->data.flag); break;
    case PMIX_PROC: printf("%s %s=%s:%u\n", what, key, v->data.proc->nspace, v->data.proc->rank);
        break;
    default: printf("%s %s=<type %d>\n", what, key, v->type);
    }
    PMIX_VALUE_RELEASE(v);
}

int main(int argc, char **argv)
{
    pmix_proc_t me, job, self, r0;
    uint32_t napps = argc > 1 ? (uint32_t)atoi(argv[1]) : 1, a;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        printf("INIT ERR %s\n", PMIx_Error_string(rc));
        return 1;
    }
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
    PMIX_LOAD_PROCID(&self, me.nspace, me.rank);
    PMIX_LOAD_PROCID(&r0, me.nspace, 0);
    const char *jobkeys[] = {PMIX_UNIV_SIZE, PMIX_JOB_SIZE, PMIX_MAX_PROCS, PMIX_JOBID,
        PMIX_NUM_NODES, PMIX_JOB_NUM_APPS, PMIX_LOCAL_SIZE, PMIX_LOCAL_PEERS, PMIX_LOCALLDR,
        PMIX_NODE_SIZE, PMIX_NODEID, PMIX_APP_SIZE, PMIX_NPROC_OFFSET, PMIX_SESSION_ID,
        PMIX_NODE_MAP, PMIX_PROC_MAP, PMIX_SPAWNED, NULL};
    const char *prockeys[] = {PMIX_APPNUM, PMIX_APP_RANK, PMIX_LOCAL_RANK, PMIX_NODE_RANK,
        PMIX_NODEID, PMIX_HOSTNAME, PMIX_GLOBAL_RANK, PMIX_PARENT_ID, NULL};
    char tag[64];
    int i;
    snprintf(tag, sizeof tag, "R%u JOB", me.rank);
    for (i = 0; jobkeys[i]; i++) show(tag, &job, jobkeys[i], NULL, 0);
    snprintf(tag, sizeof tag, "R%u PROC", me.rank);
    for (i = 0; prockeys[i]; i++) show(tag, &self, prockeys[i], NULL, 0);
    snprintf(tag, sizeof tag, "R%u PEER0", me.rank);
    show(tag, &r0, PMIX_HOSTNAME, NULL, 0);
    show(tag, &r0, PMIX_NODEID, NULL, 0);
    show(tag, &r0, PMIX_APPNUM, NULL, 0);
    for (a = 0; a < napps; a++) {
        pmix_info_t q[2];
        bool t = true;
        PMIX_INFO_LOAD(&q[0], PMIX_APP_INFO, &t, PMIX_BOOL);
        PMIX_INFO_LOAD(&q[1], PMIX_APPNUM, &a, PMIX_UINT32);
        snprintf(tag, sizeof tag, "R%u APP%u", me.rank, a);
        show(tag, &job, PMIX_APP_SIZE, q, 2);
        show(tag, &job, PMIX_APPLDR, q, 2);
    }
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
