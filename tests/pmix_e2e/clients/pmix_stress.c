/* Many threads of one PMIx client publishing and looking up at once.
 *
 *   pmix_stress pairs THREADS ITERS TAG
 *       Each thread t of rank r publishes ITERS keys p.TAG.r.t.i (even i
 *       FIRST_READ, odd i NSPACE persistence) and, after each, waits
 *       (PMIX_WAIT, PMIX_TIMEOUT 60) for the same key of its partner rank
 *       (size-1-r) and checks the value; it also publishes a LOCAL-range key
 *       and reads it back.  Then a fence (every rank done reading), each
 *       thread unpublishes half its NSPACE keys, and a second fence.
 *   pmix_stress wait THREADS ITERS TAG
 *       Thread t waits for w.TAG.r.t.i, i < ITERS, one after the other
 *       (PMIX_WAIT, PMIX_TIMEOUT 60): keys another job publishes later.
 *   pmix_stress feed THREADS ITERS TAG NRANKS
 *       Publishes w.TAG.r.t.i (FIRST_READ) for every r < NRANKS, t < THREADS,
 *       i < ITERS, THREADS threads at once (thread t publishes t's keys).
 *   pmix_stress race THREADS TIMEOUT TAG
 *       Thread t waits once for r.TAG.t (PMIX_WAIT, PMIX_TIMEOUT TIMEOUT).
 *   pmix_stress racefeed THREADS 0 TAG
 *       Thread t publishes r.TAG.t (FIRST_READ) twice, one after the other:
 *       with two waiters parked on it, the first publication goes to one
 *       (and is consumed at once), the second to the other.
 *
 * Output, one line each: "GOT key" for a value found and correct (its value
 * is "v" + the key), "BAD key status=N value=..." for anything else,
 * "PUB key status=N" for a failed publish only, "UNPUB status=N" for a
 * failed unpublish, then "DONE rank=R got=N bad=N" and PMIx_Finalize.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pmix.h>

static pmix_proc_t me;
static uint32_t size;
static int threads, iters, nranks, timeout_s;
static const char *mode, *tag;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int got_total, bad_total;

static void say(const char *fmt, const char *key, int status, const char *value)
{
    pthread_mutex_lock(&out_lock);
    printf(fmt, key, status, value ? value : "");
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
}

static int publish(const char *key, pmix_persistence_t persist, pmix_data_range_t range)
{
    pmix_info_t info[3];
    char val[600];
    int rc;
    snprintf(val, sizeof val, "v%s", key);
    PMIX_INFO_LOAD(&info[0], key, val, PMIX_STRING);
    PMIX_INFO_LOAD(&info[1], PMIX_PERSISTENCE, &persist, PMIX_PERSIST);
    PMIX_INFO_LOAD(&info[2], PMIX_RANGE, &range, PMIX_DATA_RANGE);
    rc = PMIx_Publish(info, 3);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    PMIX_INFO_DESTRUCT(&info[2]);
    if (rc != PMIX_SUCCESS) say("PUB %s status=%d%s\n", key, rc, "");
    return rc;
}

/* Look one key up (waiting if wait_s >= 0); 1 if found with the right value. */
static int lookup(const char *key, int wait_s, pmix_data_range_t range, int quiet_timeout)
{
    pmix_pdata_t pd;
    pmix_info_t info[3];
    size_t n = 0;
    int rc, ok;
    bool yes = true;
    char want[600];
    PMIX_PDATA_CONSTRUCT(&pd);
    pmix_strncpy(pd.key, key, PMIX_MAX_KEYLEN);
    if (wait_s >= 0) {
        PMIX_INFO_LOAD(&info[n], PMIX_WAIT, &yes, PMIX_BOOL); n++;
        PMIX_INFO_LOAD(&info[n], PMIX_TIMEOUT, &wait_s, PMIX_INT); n++;
    }
    PMIX_INFO_LOAD(&info[n], PMIX_RANGE, &range, PMIX_DATA_RANGE); n++;
    rc = PMIx_Lookup(&pd, 1, info, n);
    snprintf(want, sizeof want, "v%s", key);
    ok = rc == PMIX_SUCCESS && pd.value.type == PMIX_STRING && pd.value.data.string &&
         0 == strcmp(pd.value.data.string, want);
    pthread_mutex_lock(&out_lock);
    if (ok) {
        printf("GOT %s\n", key);
        got_total++;
    } else if (rc == PMIX_ERR_TIMEOUT && quiet_timeout) {
        printf("TIMEOUT %s\n", key);
    } else {
        printf("BAD %s status=%d value=%s\n", key, rc,
               pd.value.type == PMIX_STRING && pd.value.data.string ? pd.value.data.string : "");
        bad_total++;
    }
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
    PMIX_PDATA_DESTRUCT(&pd);
    return ok;
}

static void fence(void)
{
    pmix_proc_t all;
    int rc;
    PMIX_PROC_LOAD(&all, me.nspace, PMIX_RANK_WILDCARD);
    if ((rc = PMIx_Fence(&all, 1, NULL, 0)) != PMIX_SUCCESS)
        say("FENCE %s status=%d%s\n", "", rc, "");
}

static pthread_barrier_t between;

static void *pairs(void *arg)
{
    int t = (int)(long)arg, i, rc;
    uint32_t partner = size - 1 - me.rank;
    char key[256];
    for (i = 0; i < iters; i++) {
        snprintf(key, sizeof key, "p.%s.%u.%d.%d", tag, me.rank, t, i);
        publish(key, i % 2 ? PMIX_PERSIST_SESSION + 1 /* NSPACE */ : PMIX_PERSIST_FIRST_READ,
                PMIX_RANGE_SESSION);
        snprintf(key, sizeof key, "p.%s.%u.%d.%d", tag, partner, t, i);
        lookup(key, 60, PMIX_RANGE_SESSION, 0);
        snprintf(key, sizeof key, "l.%s.%u.%d.%d", tag, me.rank, t, i);
        publish(key, PMIX_PERSIST_PROC, PMIX_RANGE_LOCAL);
        lookup(key, -1, PMIX_RANGE_LOCAL, 0);
    }
    pthread_barrier_wait(&between);
    if (t == 0) fence();            /* every rank has read all it waits for */
    pthread_barrier_wait(&between);
    for (i = 1; i < iters; i += 4) {
        char *keys[2] = {key, NULL};
        snprintf(key, sizeof key, "p.%s.%u.%d.%d", tag, me.rank, t, i);
        if ((rc = PMIx_Unpublish(keys, NULL, 0)) != PMIX_SUCCESS)
            say("UNPUB %s status=%d%s\n", key, rc, "");
    }
    return NULL;
}

static void *wait_keys(void *arg)
{
    int t = (int)(long)arg, i;
    char key[256];
    for (i = 0; i < iters; i++) {
        snprintf(key, sizeof key, "w.%s.%u.%d.%d", tag, me.rank, t, i);
        lookup(key, 60, PMIX_RANGE_SESSION, 0);
    }
    return NULL;
}

static void *feed(void *arg)
{
    int t = (int)(long)arg, i, r;
    char key[256];
    for (i = 0; i < iters; i++)
        for (r = 0; r < nranks; r++) {
            snprintf(key, sizeof key, "w.%s.%d.%d.%d", tag, r, t, i);
            publish(key, PMIX_PERSIST_FIRST_READ, PMIX_RANGE_SESSION);
        }
    return NULL;
}

static void *race(void *arg)
{
    char key[256];
    snprintf(key, sizeof key, "r.%s.%d", tag, (int)(long)arg);
    lookup(key, timeout_s, PMIX_RANGE_SESSION, 1);
    return NULL;
}

static void *racefeed(void *arg)
{
    char key[256];
    snprintf(key, sizeof key, "r.%s.%d", tag, (int)(long)arg);
    publish(key, PMIX_PERSIST_FIRST_READ, PMIX_RANGE_SESSION);
    publish(key, PMIX_PERSIST_FIRST_READ, PMIX_RANGE_SESSION);
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t tid[256];
    void *(*body)(void *);
    pmix_value_t *val = NULL;
    pmix_proc_t wild;
    int t, rc;
    if (argc < 5) {
        fprintf(stderr, "usage: pmix_stress MODE THREADS ITERS TAG [NRANKS]\n");
        return 2;
    }
    mode = argv[1];
    threads = atoi(argv[2]);
    iters = timeout_s = atoi(argv[3]);
    tag = argv[4];
    nranks = argc > 5 ? atoi(argv[5]) : 0;
    if (threads < 1 || threads > 256) return 2;
    if (!strcmp(mode, "pairs")) body = pairs;
    else if (!strcmp(mode, "wait")) body = wait_keys;
    else if (!strcmp(mode, "feed")) body = feed;
    else if (!strcmp(mode, "race")) body = race;
    else if (!strcmp(mode, "racefeed")) body = racefeed;
    else return 2;
    if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init: %d\n", rc);
        return 1;
    }
    PMIX_PROC_LOAD(&wild, me.nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &val) != PMIX_SUCCESS || !val) return 1;
    size = val->data.uint32;
    PMIX_VALUE_RELEASE(val);
    pthread_barrier_init(&between, NULL, threads);
    for (t = 0; t < threads; t++) pthread_create(&tid[t], NULL, body, (void *)(long)t);
    for (t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    if (!strcmp(mode, "pairs")) fence();   /* nobody ends before all unpublished */
    printf("DONE rank=%u got=%d bad=%d\n", me.rank, got_total, bad_total);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
