/* A debugger daemon, as a debugger tool spawns one next to the processes it
 * debugs (PMIx_Spawn with PMIX_DEBUG_TARGET): a PMIx client of its own job
 * that reads whom it debugs (PMIX_DEBUG_TARGET in its job-level info), asks
 * its node for the local processes of that job (PMIX_QUERY_LOCAL_PROC_TABLE),
 * writes what it found to DIR/dbgd.RANK, waits for the other daemons to
 * have done so (PMIx_Fence of its job: a release ends the target's wait on
 * every node, and a target that ran to its end could no longer be asked
 * about), then -- as OpenPMIx's debuggerd.c means to -- releases the target
 * (PMIX_DEBUGGER_RELEASE to a custom range, the target's namespace) unless
 * its second argument is "norelease".
 * debuggerd.c sends it with range LOCAL and a custom range, which libpmix
 * 4.2.2 refuses (PMIX_ERR_BAD_PARAM: src/event/pmix_event_notification.c,
 * "a PMIX_EVENT_CUSTOM_RANGE ... but a range other than PMIX_RANGE_CUSTOM"),
 * so this one says PMIX_RANGE_CUSTOM.
 *
 * The file holds: "target=NS:RANK host=H pids=P1,P2,... status=S release=S".
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    pmix_proc_t me, wild, target;
    pmix_value_t *val = NULL;
    pmix_query_t *q;
    pmix_info_t *results = NULL, info[2];
    size_t nresults = 0, i;
    pmix_status_t rc, qrc = PMIX_ERROR, rrc = PMIX_ERROR;
    char host[256] = "", pids[2048] = "", path[4096];
    FILE *f;
    bool yes = true;

    if (argc < 2)
        return 2;
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS)
        return 1;
    gethostname(host, sizeof host);
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    rc = PMIx_Get(&wild, PMIX_DEBUG_TARGET, NULL, 0, &val);
    if (rc != PMIX_SUCCESS || val == NULL || val->type != PMIX_PROC) {
        fprintf(stderr, "no PMIX_DEBUG_TARGET: %d\n", rc);
        PMIx_Finalize(NULL, 0);
        return 3;
    }
    memcpy(&target, val->data.proc, sizeof target);

    PMIX_QUERY_CREATE(q, 1);
    PMIX_ARGV_APPEND(rc, q[0].keys, PMIX_QUERY_LOCAL_PROC_TABLE);
    PMIX_QUERY_QUALIFIERS_CREATE(&q[0], 1);
    PMIX_INFO_LOAD(&q[0].qualifiers[0], PMIX_NSPACE, target.nspace, PMIX_STRING);
    qrc = PMIx_Query_info(q, 1, &results, &nresults);
    if (qrc == PMIX_SUCCESS && nresults > 0 && results[0].value.type == PMIX_DATA_ARRAY) {
        pmix_data_array_t *d = results[0].value.data.darray;
        pmix_proc_info_t *pi = (pmix_proc_info_t *)d->array;
        for (i = 0; i < d->size; i++) {
            size_t len = strlen(pids);
            snprintf(pids + len, sizeof pids - len, "%s%d", len ? "," : "", (int)pi[i].pid);
        }
    }
    PMIx_Fence(NULL, 0, NULL, 0);
    if (argc < 3 || strcmp(argv[2], "norelease") != 0) {
        PMIX_LOAD_PROCID(&wild, target.nspace, PMIX_RANK_WILDCARD);
        PMIX_INFO_LOAD(&info[0], PMIX_EVENT_CUSTOM_RANGE, &wild, PMIX_PROC);
        PMIX_INFO_LOAD(&info[1], PMIX_EVENT_NON_DEFAULT, &yes, PMIX_BOOL);
        rrc = PMIx_Notify_event(PMIX_DEBUGGER_RELEASE, NULL, PMIX_RANGE_CUSTOM, info, 2,
                                NULL, NULL);
    }
    snprintf(path, sizeof path, "%s/dbgd.%u", argv[1], me.rank);
    f = fopen(path, "w");
    if (f != NULL) {
        fprintf(f, "target=%s:%u host=%s pids=%s status=%d release=%d\n", target.nspace,
                target.rank, host, pids, qrc, rrc);
        fclose(f);
    }
    PMIx_Finalize(NULL, 0);
    return 0;
}
