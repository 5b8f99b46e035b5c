/* PMIx events, driven by its arguments (run in order after PMIx_Init):
 *
 *   register:CODE[,CODE...]   register one handler for these codes (ALL: every event;
 *                             names: aborted=PMIX_ERR_PROC_ABORTED,
 *                             jobend=PMIX_EVENT_JOB_END, or a number)
 *   fence                     PMIx_Fence of the whole namespace (no data)
 *   exit:RANK:STATUS          rank RANK exits with STATUS here (without finalize)
 *   notify:RANGE:CODE         rank 0 raises CODE with RANGE (namespace, session,
 *                             global, custom = every rank of its own job)
 *   wait:N:MS                 wait up to MS ms until N events arrived
 *   waitmine:N:MS             the same, counting only events whose affected process
 *                             is of this job (libpmix also replays events it kept
 *                             from earlier jobs to a new handler)
 *   spawn:CMD                 PMIx_Spawn one process running CMD; prints its nspace
 *   sleep:MS
 *
 * Every event prints, from the handler and flushed:
 *   EVENT code=C source=NS:R affected=NS:R exit=E
 * (affected / exit: "-" when the event has none).  The program finalizes at
 * the end and prints DONE.
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>

static pmix_proc_t me;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int nevents = 0, nmine = 0;

static void handler(size_t id, pmix_status_t status, const pmix_proc_t *source,
                    pmix_info_t info[], size_t ninfo, pmix_info_t results[], size_t nresults,
                    pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    char affected[PMIX_MAX_NSLEN + 32] = "-", code[32] = "-";
    int mine = 0;
    size_t n;
    (void)id; (void)results; (void)nresults;
    for (n = 0; n < ninfo; n++) {
        if (PMIX_CHECK_KEY(&info[n], PMIX_EVENT_AFFECTED_PROC) &&
            info[n].value.type == PMIX_PROC) {
            snprintf(affected, sizeof affected, "%s:%u", info[n].value.data.proc->nspace,
                     info[n].value.data.proc->rank);
            mine = PMIX_CHECK_NSPACE(info[n].value.data.proc->nspace, me.nspace);
        } else if (PMIX_CHECK_KEY(&info[n], PMIX_EXIT_CODE) && info[n].value.type == PMIX_INT) {
            snprintf(code, sizeof code, "%d", info[n].value.data.integer);
        }
    }
    printf("EVENT code=%d source=%s:%u affected=%s exit=%s\n", status,
           source ? source->nspace : "?", source ? source->rank : 0, affected, code);
    fflush(stdout);
    pthread_mutex_lock(&mu);
    nevents++;
    nmine += mine;
    pthread_mutex_unlock(&mu);
    if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

static pmix_status_t code_of(const char *s)
{
    if (!strcmp(s, "aborted")) return PMIX_ERR_PROC_ABORTED;
    if (!strcmp(s, "jobend")) return PMIX_EVENT_JOB_END;
    return (pmix_status_t)atoi(s);
}

static pmix_data_range_t range_of(const char *s)
{
    if (!strcmp(s, "namespace")) return PMIX_RANGE_NAMESPACE;
    if (!strcmp(s, "session")) return PMIX_RANGE_SESSION;
    if (!strcmp(s, "global")) return PMIX_RANGE_GLOBAL;
    if (!strcmp(s, "custom")) return PMIX_RANGE_CUSTOM;
    return PMIX_RANGE_LOCAL;
}

int main(int argc, char **argv)
{
    int i;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    printf("INIT status=%d rank=%u\n", rc, me.rank);
    fflush(stdout);
    if (rc != PMIX_SUCCESS) return 1;
    for (i = 1; i < argc; i++) {
        char *arg = strdup(argv[i]);
        char *op = strtok(arg, ":");
        if (!strcmp(op, "register")) {
            char *list = strtok(NULL, ":");
            pmix_status_t codes[8];
            size_t ncodes = 0;
            if (strcmp(list, "ALL")) {
                for (char *c = strtok(list, ","); c && ncodes < 8; c = strtok(NULL, ","))
                    codes[ncodes++] = code_of(c);
            }
            rc = PMIx_Register_event_handler(ncodes ? codes : NULL, ncodes, NULL, 0, handler,
                                             NULL, NULL);
            printf("REGISTER status=%d\n", rc < 0 ? rc : 0);
        } else if (!strcmp(op, "fence")) {
            pmix_proc_t all;
            PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
            rc = PMIx_Fence(&all, 1, NULL, 0);
            printf("FENCE status=%d\n", rc);
        } else if (!strcmp(op, "exit")) {
            int rank = atoi(strtok(NULL, ":")), st = atoi(strtok(NULL, ":"));
            if ((int)me.rank == rank) {
                printf("EXITING status=%d\n", st);
                fflush(stdout);
                _exit(st);
            }
        } else if (!strcmp(op, "notify")) {
            pmix_data_range_t range = range_of(strtok(NULL, ":"));
            pmix_status_t code = code_of(strtok(NULL, ":"));
            if (me.rank == 0) {
                pmix_info_t info[2];
                size_t ninfo = 1;
                pmix_proc_t all;
                PMIX_INFO_LOAD(&info[0], PMIX_EVENT_AFFECTED_PROC, &me, PMIX_PROC);
                if (range == PMIX_RANGE_CUSTOM) {
                    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
                    PMIX_INFO_LOAD(&info[1], PMIX_EVENT_CUSTOM_RANGE, &all, PMIX_PROC);
                    ninfo = 2;
                }
                rc = PMIx_Notify_event(code, &me, range, info, ninfo, NULL, NULL);
                printf("NOTIFY status=%d\n", rc);
            }
        } else if (!strcmp(op, "wait") || !strcmp(op, "waitmine")) {
            int want = atoi(strtok(NULL, ":")), ms = atoi(strtok(NULL, ":")), got = 0;
            int only_mine = !strcmp(op, "waitmine");
            for (int t = 0; t < ms; t += 10) {
                pthread_mutex_lock(&mu);
                got = only_mine ? nmine : nevents;
                pthread_mutex_unlock(&mu);
                if (got >= want) break;
                usleep(10000);
            }
            printf("WAITED events=%d\n", got);
        } else if (!strcmp(op, "spawn")) {
            pmix_app_t app;
            char nspace[PMIX_MAX_NSLEN + 1] = "";
            PMIX_APP_CONSTRUCT(&app);
            app.cmd = strdup(strtok(NULL, ":"));
            app.argv = calloc(2, sizeof(char *));
            app.argv[0] = strdup(app.cmd);
            app.maxprocs = 1;
            rc = PMIx_Spawn(NULL, 0, &app, 1, nspace);
            printf("SPAWN status=%d nspace=%s\n", rc, nspace);
            PMIX_APP_DESTRUCT(&app);
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
