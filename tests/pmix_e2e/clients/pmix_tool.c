/* A PMIx tool (PMIx_tool_init, not a job's client), driven by its arguments:
 *
 *   first argument, where to connect:
 *     uri:URI        PMIX_SERVER_URI (a URI, or file:PATH)
 *     pid:PID        PMIX_SERVER_PIDINFO (rendezvous file of that server pid)
 *     search         PMIX_CONNECT_SYSTEM_FIRST, then libpmix's own search
 *                    (PMIX_SERVER_URI41 in the environment, rendezvous files)
 *   optionally next, as:NSPACE:RANK   the identity the tool gives itself
 *                    (PMIX_TOOL_NSPACE / PMIX_TOOL_RANK)
 *   then, in order:
 *     publish:KEY=VALUE[:RANGE[:PERSIST]]   a string; RANGE/PERSIST numbers
 *     lookup:KEY[:RANGE]                    prints the value and publisher
 *     waitlookup:KEY:SECONDS                PMIX_WAIT + PMIX_TIMEOUT
 *     unpublish:KEY
 *     query:KEY                             PMIx_Query_info, a string answer
 *     notify:CODE:RANGE                     PMIx_Notify_event
 *     hold:MS                               stay connected
 *
 * Prints, flushed: INIT status=S nspace=NS rank=R, then one line per
 * operation (PUBLISH status=S / LOOKUP status=S key=K value=V publisher=NS:R /
 * UNPUBLISH status=S / QUERY status=S key=K value=V / NOTIFY status=S), DONE.
 * Exits 1 when PMIx_tool_init fails.
 */
#include <pmix_tool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pmix_proc_t me;

static void lookup(const char *key, int range, int wait_s)
{
    pmix_pdata_t pd;
    pmix_info_t info[2];
    size_t ninfo = 0;
    pmix_status_t rc;
    PMIX_PDATA_CONSTRUCT(&pd);
    PMIX_LOAD_KEY(pd.key, key);
    if (range >= 0) {
        pmix_data_range_t r = (pmix_data_range_t)range;
        PMIX_INFO_LOAD(&info[ninfo], PMIX_RANGE, &r, PMIX_DATA_RANGE);
        ninfo++;
    }
    if (wait_s >= 0) {
        bool t = true;
        int to = wait_s;
        PMIX_INFO_LOAD(&info[ninfo], PMIX_WAIT, &t, PMIX_BOOL);
        ninfo++;
        PMIX_INFO_LOAD(&info[ninfo], PMIX_TIMEOUT, &to, PMIX_INT);
        ninfo++;
    }
    rc = PMIx_Lookup(&pd, 1, ninfo ? info : NULL, ninfo);
    if (rc == PMIX_SUCCESS && pd.value.type == PMIX_STRING)
        printf("LOOKUP status=%d key=%s value=%s publisher=%s:%u\n", rc, key,
               pd.value.data.string, pd.proc.nspace, pd.proc.rank);
    else
        printf("LOOKUP status=%d key=%s\n", rc, key);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    pmix_info_t info[3];
    size_t ninfo = 0;
    pmix_status_t rc;
    int i, first = 2;
    if (argc < 2) {
        fprintf(stderr, "usage: pmix_tool uri:URI|pid:PID|search OP...\n");
        return 2;
    }
    if (!strncmp(argv[1], "uri:", 4)) {
        PMIX_INFO_LOAD(&info[0], PMIX_SERVER_URI, argv[1] + 4, PMIX_STRING);
        ninfo = 1;
    } else if (!strncmp(argv[1], "pid:", 4)) {
        pid_t pid = (pid_t)atoi(argv[1] + 4);
        PMIX_INFO_LOAD(&info[0], PMIX_SERVER_PIDINFO, &pid, PMIX_PID);
        ninfo = 1;
    } else {
        PMIX_INFO_LOAD(&info[0], PMIX_CONNECT_SYSTEM_FIRST, NULL, PMIX_BOOL);
        ninfo = 1;
    }
    if (argc > 2 && !strncmp(argv[2], "as:", 3)) {
        char *a = strdup(argv[2] + 3), *colon = strrchr(a, ':');
        pmix_rank_t r;
        *colon = '\0';
        r = (pmix_rank_t)strtoul(colon + 1, NULL, 10);
        PMIX_INFO_LOAD(&info[ninfo], PMIX_TOOL_NSPACE, a, PMIX_STRING);
        ninfo++;
        PMIX_INFO_LOAD(&info[ninfo], PMIX_TOOL_RANK, &r, PMIX_PROC_RANK);
        ninfo++;
        first = 3;
    }
    rc = PMIx_tool_init(&me, info, ninfo);
    printf("INIT status=%d nspace=%s rank=%u\n", rc, rc == PMIX_SUCCESS ? me.nspace : "-",
           rc == PMIX_SUCCESS ? me.rank : 0);
    fflush(stdout);
    if (rc != PMIX_SUCCESS)
        return 1;
    for (i = first; i < argc; i++) {
        char *a = strdup(argv[i]), *op = strtok(a, ":");
        if (!strcmp(op, "publish")) {
            char *kv = strtok(NULL, ":"), *rs = strtok(NULL, ":"), *ps = strtok(NULL, ":");
            char *eq = strchr(kv, '=');
            pmix_info_t pi[3];
            size_t n = 1;
            *eq = '\0';
            PMIX_INFO_LOAD(&pi[0], kv, eq + 1, PMIX_STRING);
            if (rs) {
                pmix_data_range_t r = (pmix_data_range_t)atoi(rs);
                PMIX_INFO_LOAD(&pi[n], PMIX_RANGE, &r, PMIX_DATA_RANGE);
                n++;
            }
            if (ps) {
                pmix_persistence_t p = (pmix_persistence_t)atoi(ps);
                PMIX_INFO_LOAD(&pi[n], PMIX_PERSISTENCE, &p, PMIX_PERSIST);
                n++;
            }
            rc = PMIx_Publish(pi, n);
            printf("PUBLISH status=%d\n", rc);
        } else if (!strcmp(op, "lookup")) {
            char *k = strtok(NULL, ":"), *rs = strtok(NULL, ":");
            lookup(k, rs ? atoi(rs) : -1, -1);
        } else if (!strcmp(op, "waitlookup")) {
            char *k = strtok(NULL, ":"), *ws = strtok(NULL, ":");
            lookup(k, -1, ws ? atoi(ws) : 0);
        } else if (!strcmp(op, "unpublish")) {
            char *k = strtok(NULL, ":");
            char *keys[2] = {k, NULL};
            rc = PMIx_Unpublish(keys, NULL, 0);
            printf("UNPUBLISH status=%d\n", rc);
        } else if (!strcmp(op, "query")) {
            char *k = strtok(NULL, ":");
            pmix_query_t *q;
            pmix_info_t *res = NULL;
            size_t nres = 0;
            PMIX_QUERY_CREATE(q, 1);
            PMIX_ARGV_APPEND(rc, q[0].keys, k);
            rc = PMIx_Query_info(q, 1, &res, &nres);
            if (rc == PMIX_SUCCESS && nres > 0 && res[0].value.type == PMIX_STRING)
                printf("QUERY status=%d key=%s value=%s\n", rc, k, res[0].value.data.string);
            else
                printf("QUERY status=%d key=%s\n", rc, k);
        } else if (!strcmp(op, "notify")) {
            int code = atoi(strtok(NULL, ":"));
            pmix_data_range_t r = (pmix_data_range_t)atoi(strtok(NULL, ":"));
            rc = PMIx_Notify_event(code, &me, r, NULL, 0, NULL, NULL);
            printf("NOTIFY status=%d\n", rc);
        } else if (!strcmp(op, "hold")) {
            usleep(1000 * atoi(strtok(NULL, ":")));
        } else {
            fprintf(stderr, "unknown operation %s\n", argv[i]);
            return 2;
        }
        fflush(stdout);
        free(a);
    }
    rc = PMIx_tool_finalize();
    printf("DONE status=%d\n", rc);
    fflush(stdout);
    return 0;
}
