/* PMIx job control and allocation requests from a process of a job.
 *
 *   pmix_jctrl MODE [SECONDS]
 *
 * Every rank connects, says READY, and fences with the others; then:
 *
 *   signal   rank 1 catches SIGUSR1; rank 0 asks PMIx_Job_control to send
 *            SIGUSR1 to rank 1 and prints the status; rank 1 prints
 *            SIGNALLED once its handler ran; both fence again and finish.
 *   kill     rank 0 asks for rank 1 to be killed (PMIX_JOB_CTRL_KILL),
 *            prints the status and finishes; rank 1 waits to be killed
 *            (then says SURVIVED).
 *   term     rank 0 asks for its whole namespace to be terminated
 *            (PMIX_JOB_CTRL_TERMINATE, rank PMIX_RANK_WILDCARD); every
 *            rank waits to be ended (SURVIVED after the wait).
 *   self     as term with no targets at all (the caller's namespace).
 *   notes    rank 0 declares itself preemptible with a checkpoint method
 *            (nothing to do for a host that never preempts): the status.
 *   other    rank 0 signals a process of a namespace that does not exist.
 *   badsig   rank 0 asks for signal 0 (no signal): the status.
 *   ckpt     rank 0 asks for a checkpoint: the status.
 *   killns   rank 0 asks for namespace SECONDS (here a namespace, not a
 *            number) to be killed: the status.
 *   alloc    rank 0 asks for a new allocation of 12 nodes, to extend and to
 *            release its allocation, and queries an allocation's status:
 *            one line each with the status.
 *
 * SECONDS (default 60) bounds every wait above.
 * Each status line: "<WHAT> rank=R status=N (NAME)".
 */

#define _GNU_SOURCE
#include <pmix.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pmix_proc_t me;
static volatile sig_atomic_t got_signal = 0;
static int wait_tenths = 600;

static void on_usr1(int sig) { got_signal = sig; }

static void say(const char *what, pmix_status_t rc)
{
    printf("%s rank=%u status=%d (%s)\n", what, me.rank, rc, PMIx_Error_string(rc));
    fflush(stdout);
}

static void fence(void)
{
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    pmix_status_t rc = PMIx_Fence(&all, 1, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        say("FENCE", rc);
        exit(3);
    }
}

static void wait_to_die(void)
{
    for (int i = 0; i < wait_tenths; i++)
        usleep(100000);
    printf("SURVIVED rank=%u\n", me.rank);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    exit(4);
}

static pmix_status_t jctrl(const pmix_proc_t *targets, size_t ntargets, pmix_info_t *dirs,
                           size_t ndirs)
{
    pmix_info_t *results = NULL;
    size_t nresults = 0;
    pmix_status_t rc = PMIx_Job_control(targets, ntargets, dirs, ndirs, &results, &nresults);
    if (NULL != results)
        PMIX_INFO_FREE(results, nresults);
    return rc;
}

static pmix_status_t alloc(pmix_alloc_directive_t directive)
{
    pmix_info_t info[2];
    pmix_info_t *results = NULL;
    size_t nresults = 0;
    uint64_t nnodes = 12;
    PMIX_INFO_LOAD(&info[0], PMIX_ALLOC_NUM_NODES, &nnodes, PMIX_UINT64);
    PMIX_INFO_LOAD(&info[1], PMIX_ALLOC_REQ_ID, "jctrl-test", PMIX_STRING);
    pmix_status_t rc = PMIx_Allocation_request(directive, info, 2, &results, &nresults);
    if (NULL != results)
        PMIX_INFO_FREE(results, nresults);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    return rc;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[1];
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s MODE [SECONDS]\n", argv[0]);
        return 2;
    }
    if (argc == 3 && 0 != strcmp(mode, "killns"))
        wait_tenths = 10 * atoi(argv[2]);
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    if (0 == strcmp(mode, "signal") && 1 == me.rank) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_usr1;
        sigaction(SIGUSR1, &sa, NULL);
    }
    printf("READY rank=%u\n", me.rank);
    fence();

    pmix_info_t dir;
    pmix_proc_t target;
    bool yes = true;
    int sig;
    if (0 == strcmp(mode, "signal")) {
        if (0 == me.rank) {
            sig = SIGUSR1;
            PMIX_LOAD_PROCID(&target, me.nspace, 1);
            PMIX_INFO_LOAD(&dir, PMIX_JOB_CTRL_SIGNAL, &sig, PMIX_INT);
            say("JCTRL", jctrl(&target, 1, &dir, 1));
        } else if (1 == me.rank) {
            for (int i = 0; i < wait_tenths && !got_signal; i++)
                usleep(100000);
            printf("SIGNALLED rank=%u sig=%d\n", me.rank, (int) got_signal);
        }
        fence();
    } else if (0 == strcmp(mode, "kill")) {
        if (0 == me.rank) {
            PMIX_LOAD_PROCID(&target, me.nspace, 1);
            PMIX_INFO_LOAD(&dir, PMIX_JOB_CTRL_KILL, &yes, PMIX_BOOL);
            say("JCTRL", jctrl(&target, 1, &dir, 1));
        } else {
            wait_to_die();
        }
    } else if (0 == strcmp(mode, "term") || 0 == strcmp(mode, "self")) {
        if (0 == me.rank) {
            PMIX_LOAD_PROCID(&target, me.nspace, PMIX_RANK_WILDCARD);
            PMIX_INFO_LOAD(&dir, PMIX_JOB_CTRL_TERMINATE, &yes, PMIX_BOOL);
            say("JCTRL", 0 == strcmp(mode, "term") ? jctrl(&target, 1, &dir, 1)
                                                   : jctrl(NULL, 0, &dir, 1));
        }
        wait_to_die();
    } else if (0 == me.rank && 0 == strcmp(mode, "notes")) {
        pmix_info_t notes[2];
        pmix_info_t *method;
        pmix_status_t code = PMIX_JCTRL_CHECKPOINT;
        PMIX_INFO_LOAD(&notes[0], PMIX_JOB_CTRL_PREEMPTIBLE, &yes, PMIX_BOOL);
        PMIX_INFO_CONSTRUCT(&notes[1]);
        PMIX_LOAD_KEY(notes[1].key, PMIX_JOB_CTRL_CHECKPOINT_METHOD);
        notes[1].value.type = PMIX_DATA_ARRAY;
        PMIX_DATA_ARRAY_CREATE(notes[1].value.data.darray, 2, PMIX_INFO);
        method = (pmix_info_t *) notes[1].value.data.darray->array;
        sig = SIGUSR2;
        PMIX_INFO_LOAD(&method[0], PMIX_JOB_CTRL_CHECKPOINT_SIGNAL, &sig, PMIX_INT);
        PMIX_INFO_LOAD(&method[1], PMIX_JOB_CTRL_CHECKPOINT_EVENT, &code, PMIX_STATUS);
        say("JCTRL", jctrl(NULL, 0, notes, 2));
    } else if (0 == me.rank && 0 == strcmp(mode, "other")) {
        sig = SIGUSR1;
        PMIX_LOAD_PROCID(&target, "no-such-namespace", 0);
        PMIX_INFO_LOAD(&dir, PMIX_JOB_CTRL_SIGNAL, &sig, PMIX_INT);
        say("JCTRL", jctrl(&target, 1, &dir, 1));
    } else if (0 == me.rank && 0 == strcmp(mode, "badsig")) {
        sig = 0;
        PMIX_LOAD_PROCID(&target, me.nspace, 0);
        PMIX_INFO_LOAD(&dir, PMIX_JOB_CTRL_SIGNAL, &sig, PMIX_INT);
        say("JCTRL", jctrl(&target, 1, &dir, 1));
    } else if (0 == me.rank && 0 == strcmp(mode, "ckpt")) {
        PMIX_LOAD_PROCID(&target, me.nspace, PMIX_RANK_WILDCARD);
        PMIX_INFO_LOAD(&dir, PMIX_JOB_CTRL_CHECKPOINT, "ckpt-1", PMIX_STRING);
        say("JCTRL", jctrl(&target, 1, &dir, 1));
    } else if (0 == me.rank && 0 == strcmp(mode, "killns") && argc == 3) {
        PMIX_LOAD_PROCID(&target, argv[2], PMIX_RANK_WILDCARD);
        PMIX_INFO_LOAD(&dir, PMIX_JOB_CTRL_KILL, &yes, PMIX_BOOL);
        say("JCTRL", jctrl(&target, 1, &dir, 1));
    } else if (0 == me.rank && 0 == strcmp(mode, "alloc")) {
        say("ALLOC_NEW", alloc(PMIX_ALLOC_NEW));
        say("ALLOC_EXTEND", alloc(PMIX_ALLOC_EXTEND));
        say("ALLOC_RELEASE", alloc(PMIX_ALLOC_RELEASE));
        pmix_query_t *q;
        pmix_info_t *results = NULL;
        size_t nresults = 0;
        PMIX_QUERY_CREATE(q, 1);
        PMIX_ARGV_APPEND(rc, q[0].keys, PMIX_QUERY_ALLOC_STATUS);
        PMIX_INFO_CREATE(q[0].qualifiers, 1);
        q[0].nqual = 1;
        PMIX_INFO_LOAD(&q[0].qualifiers[0], PMIX_ALLOC_ID, "jctrl-test", PMIX_STRING);
        rc = PMIx_Query_info(q, 1, &results, &nresults);
        say("ALLOC_QUERY", rc);
        if (NULL != results)
            PMIX_INFO_FREE(results, nresults);
        PMIX_QUERY_FREE(q, 1);
    }
    printf("DONE rank=%u\n", me.rank);
    rc = PMIx_Finalize(NULL, 0);
    return PMIX_SUCCESS == rc ? 0 : 1;
}
