/* A debugger tool, modelled on what OpenPMIx's examples/debugger.c does,
 * against a DVM's PMIx server.  Arguments:
 *
 *   first, where to connect:  uri:URI (PMIX_SERVER_URI)  |  search
 *   then, in order:
 *     support                 PMIX_QUERY_SPAWN_SUPPORT, PMIX_QUERY_DEBUG_SUPPORT
 *     launch:N:CMD[:ARG]      PMIx_Spawn of N copies of CMD [ARG] in our
 *                             directory, with PMIX_DEBUG_STOP_IN_INIT: the job
 *                             to debug (its namespace is remembered); CMD
 *                             @./PROG: command PROG, argv[0] ./PROG (as
 *                             OpenPMIx's debugger.c names its "client")
 *     attach:NSPACE           debug a job already running (started stopped)
 *     table:N                 PMIX_QUERY_PROC_TABLE of the job, asked again
 *                             until it lists N running processes with pids
 *     daemons:PERNODE:CMD[:ARG]  PMIx_Spawn of debugger daemons next to the
 *                             job's processes (PMIX_DEBUGGER_DAEMONS,
 *                             PMIX_DEBUG_TARGET, PMIX_DEBUG_DAEMONS_PER_NODE)
 *     spawnbad:KEY            a spawn with a directive pydvm refuses
 *     release[:RANK]          PMIX_DEBUGGER_RELEASE to the job (custom range:
 *                             the whole job, or that rank)
 *     waitend                 until PMIX_QUERY_NAMESPACES no longer lists it
 *
 * Prints, flushed: INIT status=S nspace=NS, then per step SUPPORT spawn=..
 * debug=.. / SPAWN status=S nspace=NS / PROC rank=R host=H exe=E pid=P
 * state=S and TABLE status=S n=N / DAEMONS status=S nspace=NS / RELEASE
 * status=S / ENDED status=S; DONE.  Exits 1 when PMIx_tool_init fails.
 */
#include <pmix_tool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char job[PMIX_MAX_NSLEN + 1] = "";

static pmix_status_t query(const char *key, const char *nspace, pmix_info_t **res, size_t *n)
{
    pmix_query_t *q;
    pmix_status_t rc;
    PMIX_QUERY_CREATE(q, 1);
    PMIX_ARGV_APPEND(rc, q[0].keys, key);
    if (nspace != NULL) {
        PMIX_QUERY_QUALIFIERS_CREATE(&q[0], 1);
        PMIX_INFO_LOAD(&q[0].qualifiers[0], PMIX_NSPACE, nspace, PMIX_STRING);
    }
    *res = NULL;
    *n = 0;
    rc = PMIx_Query_info(q, 1, res, n);
    PMIX_QUERY_FREE(q, 1);
    return rc;
}

static const char *str_of(pmix_info_t *res, size_t n)
{
    return (n > 0 && res[0].value.type == PMIX_STRING && res[0].value.data.string)
               ? res[0].value.data.string : "";
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static pmix_status_t spawn(pmix_info_t *jinfo, size_t njinfo, int n, char *spec, char *out)
{
    pmix_app_t *app;
    char cwd[1024], *cmd = strtok(spec, ":"), *arg = strtok(NULL, ":");
    pmix_status_t rc;
    PMIX_APP_CREATE(app, 1);
    if (cmd[0] == '@') {
        const char *slash = strrchr(cmd + 1, '/');
        app->cmd = strdup(slash ? slash + 1 : cmd + 1);
        PMIX_ARGV_APPEND(rc, app->argv, cmd + 1);
    } else {
        app->cmd = strdup(cmd);
        PMIX_ARGV_APPEND(rc, app->argv, cmd);
    }
    if (arg != NULL)
        PMIX_ARGV_APPEND(rc, app->argv, arg);
    if (getcwd(cwd, sizeof cwd) != NULL)
        app->cwd = strdup(cwd);
    app->maxprocs = n;
    rc = PMIx_Spawn(jinfo, njinfo, app, 1, out);
    PMIX_APP_FREE(app, 1);
    return rc;
}

int main(int argc, char **argv)
{
    pmix_proc_t me;
    pmix_info_t init[1], *res;
    size_t nres, i;
    pmix_status_t rc;
    bool yes = true;
    int a;

    if (argc < 2)
        return 2;
    if (!strncmp(argv[1], "uri:", 4)) {
        PMIX_INFO_LOAD(&init[0], PMIX_SERVER_URI, argv[1] + 4, PMIX_STRING);
    } else {
        PMIX_INFO_LOAD(&init[0], PMIX_CONNECT_SYSTEM_FIRST, &yes, PMIX_BOOL);
    }
    rc = PMIx_tool_init(&me, init, 1);
    printf("INIT status=%d nspace=%s\n", rc, rc == PMIX_SUCCESS ? me.nspace : "");
    fflush(stdout);
    if (rc != PMIX_SUCCESS)
        return 1;
    for (a = 2; a < argc; a++) {
        char *step = strdup(argv[a]), *op = strtok(step, ":");
        if (!strcmp(op, "support")) {
            pmix_info_t *r2;
            size_t n2;
            pmix_status_t rc2;
            rc = query(PMIX_QUERY_SPAWN_SUPPORT, NULL, &res, &nres);
            rc2 = query(PMIX_QUERY_DEBUG_SUPPORT, NULL, &r2, &n2);
            printf("SUPPORT status=%d,%d spawn=%s debug=%s\n", rc, rc2, str_of(res, nres),
                   str_of(r2, n2));
        } else if (!strcmp(op, "launch")) {
            pmix_info_t jinfo[1];
            int n = atoi(strtok(NULL, ":"));
            PMIX_INFO_LOAD(&jinfo[0], PMIX_DEBUG_STOP_IN_INIT, &yes, PMIX_BOOL);
            rc = spawn(jinfo, 1, n, strtok(NULL, ""), job);
            printf("SPAWN status=%d nspace=%s\n", rc, rc == PMIX_SUCCESS ? job : "");
        } else if (!strcmp(op, "attach")) {
            snprintf(job, sizeof job, "%s", strtok(NULL, ""));
        } else if (!strcmp(op, "table")) {
            size_t want = (size_t)atoi(strtok(NULL, ":")), running = 0;
            double end = now() + 30;
            for (;;) {
                rc = query(PMIX_QUERY_PROC_TABLE, job, &res, &nres);
                running = 0;
                if (rc == PMIX_SUCCESS && nres > 0 && res[0].value.type == PMIX_DATA_ARRAY) {
                    pmix_data_array_t *d = res[0].value.data.darray;
                    pmix_proc_info_t *pi = (pmix_proc_info_t *)d->array;
                    for (i = 0; i < d->size; i++)
                        if (pi[i].state == PMIX_PROC_STATE_RUNNING && pi[i].pid > 0)
                            running++;
                    if (running == want || now() > end) {
                        for (i = 0; i < d->size; i++)
                            printf("PROC rank=%u host=%s exe=%s pid=%d state=%d\n",
                                   pi[i].proc.rank, pi[i].hostname, pi[i].executable_name,
                                   (int)pi[i].pid, (int)pi[i].state);
                        break;
                    }
                } else if (now() > end) {
                    break;
                }
                usleep(50000); /* a launch under way: ask again */
            }
            printf("TABLE status=%d n=%zu\n", rc, running);
        } else if (!strcmp(op, "daemons")) {
            pmix_info_t jinfo[3];
            pmix_proc_t target;
            uint16_t per = (uint16_t)atoi(strtok(NULL, ":"));
            char dspace[PMIX_MAX_NSLEN + 1] = "";
            PMIX_LOAD_PROCID(&target, job, PMIX_RANK_WILDCARD);
            PMIX_INFO_LOAD(&jinfo[0], PMIX_DEBUGGER_DAEMONS, &yes, PMIX_BOOL);
            PMIX_INFO_LOAD(&jinfo[1], PMIX_DEBUG_TARGET, &target, PMIX_PROC);
            PMIX_INFO_LOAD(&jinfo[2], PMIX_DEBUG_DAEMONS_PER_NODE, &per, PMIX_UINT16);
            rc = spawn(jinfo, 3, 0, strtok(NULL, ""), dspace);
            printf("DAEMONS status=%d nspace=%s\n", rc, rc == PMIX_SUCCESS ? dspace : "");
        } else if (!strcmp(op, "spawnbad")) {
            pmix_info_t jinfo[1];
            char ns[PMIX_MAX_NSLEN + 1] = "", cmd[] = "true";
            PMIX_INFO_LOAD(&jinfo[0], strtok(NULL, ""), &yes, PMIX_BOOL);
            rc = spawn(jinfo, 1, 1, cmd, ns);
            printf("SPAWN status=%d nspace=%s\n", rc, rc == PMIX_SUCCESS ? ns : "");
        } else if (!strcmp(op, "release")) {
            pmix_info_t info[2];
            pmix_proc_t all;
            char *r = strtok(NULL, ":");
            PMIX_LOAD_PROCID(&all, job, r ? (pmix_rank_t)atoi(r) : PMIX_RANK_WILDCARD);
            PMIX_INFO_LOAD(&info[0], PMIX_EVENT_CUSTOM_RANGE, &all, PMIX_PROC);
            PMIX_INFO_LOAD(&info[1], PMIX_EVENT_NON_DEFAULT, &yes, PMIX_BOOL);
            rc = PMIx_Notify_event(PMIX_DEBUGGER_RELEASE, &me, PMIX_RANGE_CUSTOM, info, 2,
                                   NULL, NULL);
            printf("RELEASE status=%d\n", rc);
        } else if (!strcmp(op, "waitend")) {
            double end = now() + 30;
            for (;;) {
                rc = query(PMIX_QUERY_NAMESPACES, NULL, &res, &nres);
                if (rc != PMIX_SUCCESS || strstr(str_of(res, nres), job) == NULL ||
                    now() > end)
                    break;
                usleep(50000); /* the job still runs */
            }
            printf("ENDED status=%d %s\n", rc, now() > end ? "no" : "yes");
        } else {
            fprintf(stderr, "unknown step %s\n", argv[a]);
            return 2;
        }
        fflush(stdout);
        free(step);
    }
    rc = PMIx_tool_finalize();
    printf("DONE status=%d\n", rc);
    fflush(stdout);
    return 0;
}
