/* A PMIx client driven by its arguments, for the binding's tests.
 *
 * Each argument is one operation, run in order after PMIx_Init; each prints
 * one result line (more for lookups) and the program ends with
 * PMIx_Finalize unless "nofin" was given.  Operations:
 *
 *   pub:KEY:TYPE:VALUE            publish one typed value, no directives
 *   pubd:DIRS:KEY:TYPE:VALUE      publish with directives
 *   look:K1,K2                    PMIx_Lookup of keys, no directives
 *   lookd:DIRS:K1,K2              PMIx_Lookup with directives
 *   unpub:K1,K2 | unpub:*         PMIx_Unpublish of keys / of everything
 *   unpubd:DIRS:K1,K2             PMIx_Unpublish of keys with directives
 *   unpublong:N                   PMIx_Unpublish of one key N bytes long
 *   lookuplong:N                  PMIx_Lookup_nb of one key N bytes long
 *   put:KEY:STRING  commit  fence:COLLECT(0|1)  get:RANK:KEY
 *   connect  disconnect           PMIx_Connect / Disconnect of the whole namespace
 *   spawn:CMD:NPROCS              PMIx_Spawn of one app (argv CMD x, env X=1, cwd /)
 *   sleep:MS   nofin   abort:STATUS
 *   waitfile:PATH                 wait (up to 60 s) until PATH exists
 *
 * DIRS is a comma list of NAME=TYPE/VALUE with NAME one of range, persist,
 * wait, timeout (the PMIx attributes) and TYPE a type name below.
 * Types: string bytes(hex) bool int int8 int16 int32 int64 uint uint8
 * uint16 uint32 uint64 size pid float double range persist status rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pmix.h>

static pmix_proc_t me;

static int load(pmix_value_t *v, const char *type, const char *s)
{
    memset(v, 0, sizeof(*v));
    if (!strcmp(type, "string")) { v->type = PMIX_STRING; v->data.string = strdup(s); }
    else if (!strcmp(type, "bytes")) {
        size_t n = strlen(s) / 2, i;
        char *b = malloc(n ? n : 1);
        for (i = 0; i < n; i++) { unsigned x; sscanf(s + 2 * i, "%2x", &x); b[i] = (char)x; }
        v->type = PMIX_BYTE_OBJECT; v->data.bo.bytes = b; v->data.bo.size = n;
    }
    else if (!strcmp(type, "bool")) { v->type = PMIX_BOOL; v->data.flag = atoi(s) != 0; }
    else if (!strcmp(type, "int")) { v->type = PMIX_INT; v->data.integer = atoi(s); }
    else if (!strcmp(type, "int8")) { v->type = PMIX_INT8; v->data.int8 = (int8_t)atoi(s); }
    else if (!strcmp(type, "int16")) { v->type = PMIX_INT16; v->data.int16 = (int16_t)atoi(s); }
    else if (!strcmp(type, "int32")) { v->type = PMIX_INT32; v->data.int32 = (int32_t)atol(s); }
    else if (!strcmp(type, "int64")) { v->type = PMIX_INT64; v->data.int64 = strtoll(s, NULL, 10); }
    else if (!strcmp(type, "uint")) { v->type = PMIX_UINT; v->data.uint = (unsigned)strtoul(s, NULL, 10); }
    else if (!strcmp(type, "uint8")) { v->type = PMIX_UINT8; v->data.uint8 = (uint8_t)strtoul(s, NULL, 10); }
    else if (!strcmp(type, "uint16")) { v->type = PMIX_UINT16; v->data.uint16 = (uint16_t)strtoul(s, NULL, 10); }
    else if (!strcmp(type, "uint32")) { v->type = PMIX_UINT32; v->data.uint32 = (uint32_t)strtoul(s, NULL, 10); }
    else if (!strcmp(type, "uint64")) { v->type = PMIX_UINT64; v->data.uint64 = strtoull(s, NULL, 10); }
    else if (!strcmp(type, "size")) { v->type = PMIX_SIZE; v->data.size = (size_t)strtoull(s, NULL, 10); }
    else if (!strcmp(type, "pid")) { v->type = PMIX_PID; v->data.pid = (pid_t)atol(s); }
    else if (!strcmp(type, "float")) { v->type = PMIX_FLOAT; v->data.fval = strtof(s, NULL); }
    else if (!strcmp(type, "double")) { v->type = PMIX_DOUBLE; v->data.dval = strtod(s, NULL); }
    else if (!strcmp(type, "range")) { v->type = PMIX_DATA_RANGE; v->data.range = (pmix_data_range_t)atoi(s); }
    else if (!strcmp(type, "persist")) { v->type = PMIX_PERSIST; v->data.persist = (pmix_persistence_t)atoi(s); }
    else if (!strcmp(type, "status")) { v->type = PMIX_STATUS; v->data.status = atoi(s); }
    else if (!strcmp(type, "rank")) { v->type = PMIX_PROC_RANK; v->data.rank = (pmix_rank_t)strtoul(s, NULL, 10); }
    else if (!strcmp(type, "time")) { v->type = PMIX_TIME; v->data.time = (time_t)atol(s); }
    else { fprintf(stderr, "unknown type %s\n", type); return -1; }
    return 0;
}

static void print_value(const pmix_value_t *v)
{
    size_t i;
    switch (v->type) {
    case PMIX_STRING: printf("type=%d value=%s", v->type, v->data.string); break;
    case PMIX_BYTE_OBJECT:
        printf("type=%d value=", v->type);
        for (i = 0; i < v->data.bo.size; i++) printf("%02x", (unsigned char)v->data.bo.bytes[i]);
        break;
    case PMIX_BOOL: printf("type=%d value=%d", v->type, v->data.flag ? 1 : 0); break;
    case PMIX_INT: printf("type=%d value=%d", v->type, v->data.integer); break;
    case PMIX_INT8: printf("type=%d value=%d", v->type, v->data.int8); break;
    case PMIX_INT16: printf("type=%d value=%d", v->type, v->data.int16); break;
    case PMIX_INT32: printf("type=%d value=%d", v->type, v->data.int32); break;
    case PMIX_INT64: printf("type=%d value=%lld", v->type, (long long)v->data.int64); break;
    case PMIX_UINT: printf("type=%d value=%u", v->type, v->data.uint); break;
    case PMIX_UINT8: printf("type=%d value=%u", v->type, v->data.uint8); break;
    case PMIX_UINT16: printf("type=%d value=%u", v->type, v->data.uint16); break;
    case PMIX_UINT32: printf("type=%d value=%u", v->type, v->data.uint32); break;
    case PMIX_UINT64: printf("type=%d value=%llu", v->type, (unsigned long long)v->data.uint64); break;
    case PMIX_SIZE: printf("type=%d value=%zu", v->type, v->data.size); break;
    case PMIX_PID: printf("type=%d value=%d", v->type, (int)v->data.pid); break;
    case PMIX_FLOAT: printf("type=%d value=%.9g", v->type, v->data.fval); break;
    case PMIX_DOUBLE: printf("type=%d value=%.17g", v->type, v->data.dval); break;
    case PMIX_STATUS: printf("type=%d value=%d", v->type, v->data.status); break;
    case PMIX_PROC_RANK: printf("type=%d value=%u", v->type, v->data.rank); break;
    default: printf("type=%d value=?", v->type);
    }
}

static const char *attr(const char *name)
{
    if (!strcmp(name, "range")) return PMIX_RANGE;
    if (!strcmp(name, "persist")) return PMIX_PERSISTENCE;
    if (!strcmp(name, "wait")) return PMIX_WAIT;
    if (!strcmp(name, "timeout")) return PMIX_TIMEOUT;
    return name;
}

/* "range=INT/3,wait=BOOL/1" -> info array; returns count */
static size_t directives(char *spec, pmix_info_t **out)
{
    size_t n = 1, k = 0;
    char *p, *save = NULL, *tok;
    for (p = spec; *p; p++) if (*p == ',') n++;
    PMIX_INFO_CREATE(*out, n);
    for (tok = strtok_r(spec, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '='), *sl;
        if (!eq || !(sl = strchr(eq, '/'))) continue;
        *eq = 0; *sl = 0;
        pmix_strncpy((*out)[k].key, attr(tok), PMIX_MAX_KEYLEN);
        if (load(&(*out)[k].value, eq + 1, sl + 1) == 0) k++;
    }
    return k;
}

static char **split(char *s, const char *sep, size_t *n)
{
    char **v = calloc(strlen(s) + 2, sizeof(char *)), *save = NULL, *t;
    *n = 0;
    for (t = strtok_r(s, sep, &save); t; t = strtok_r(NULL, sep, &save)) v[(*n)++] = t;
    v[*n] = NULL;
    return v;
}

static void do_publish(char *dirs, char *key, char *type, char *val)
{
    pmix_info_t *info, *d = NULL;
    size_t nd = dirs ? directives(dirs, &d) : 0, i;
    pmix_status_t rc;
    PMIX_INFO_CREATE(info, nd + 1);
    pmix_strncpy(info[0].key, key, PMIX_MAX_KEYLEN);
    if (load(&info[0].value, type, val)) { printf("PUBLISH key=%s status=badtype\n", key); return; }
    for (i = 0; i < nd; i++) PMIx_Info_xfer(&info[i + 1], &d[i]);
    rc = PMIx_Publish(info, nd + 1);
    printf("PUBLISH key=%s status=%d\n", key, rc);
    fflush(stdout);
}

static void do_lookup(char *dirs, char *keys)
{
    size_t nk, nd = 0, i;
    pmix_info_t *d = NULL;
    char **k = split(keys, ",", &nk);
    pmix_pdata_t *pd;
    pmix_status_t rc;
    if (dirs) nd = directives(dirs, &d);
    PMIX_PDATA_CREATE(pd, nk);
    for (i = 0; i < nk; i++) pmix_strncpy(pd[i].key, k[i], PMIX_MAX_KEYLEN);
    rc = PMIx_Lookup(pd, nk, d, nd);
    printf("LOOKUP status=%d\n", rc);
    for (i = 0; i < nk; i++) {
        if (pd[i].value.type == PMIX_UNDEF) continue;
        printf("FOUND key=%s proc=%s:%u ", pd[i].key, pd[i].proc.nspace, pd[i].proc.rank);
        print_value(&pd[i].value);
        printf("\n");
    }
    fflush(stdout);
}

static volatile int lk_done = 0;
static pmix_status_t lk_status;
static void lk_cb(pmix_status_t status, pmix_pdata_t data[], size_t ndata, void *cbdata)
{
    (void)data; (void)ndata; (void)cbdata;
    lk_status = status;
    lk_done = 1;
}

static char *longkey(int n)
{
    char *s = malloc(n + 1);
    memset(s, 'k', n);
    s[n] = 0;
    return s;
}

int main(int argc, char **argv)
{
    pmix_status_t rc;
    int i, fin = 1;
    if (PMIX_SUCCESS != (rc = PMIx_Init(&me, NULL, 0))) {
        printf("INIT status=%d\n", rc);
        return 1;
    }
    printf("INIT status=0 nspace=%s rank=%u\n", me.nspace, me.rank);
    fflush(stdout);
    for (i = 1; i < argc; i++) {
        char *a = strdup(argv[i]);
        char *op = a, *rest = strchr(a, ':');
        if (rest) *rest++ = 0;
        if (!strcmp(op, "pub")) {
            char *key = strtok(rest, ":"), *type = strtok(NULL, ":"), *val = strtok(NULL, "");
            do_publish(NULL, key, type, val ? val : "");
        } else if (!strcmp(op, "pubd")) {
            char *dirs = strtok(rest, ":"), *key = strtok(NULL, ":"), *type = strtok(NULL, ":"),
                 *val = strtok(NULL, "");
            do_publish(dirs, key, type, val ? val : "");
        } else if (!strcmp(op, "look")) {
            do_lookup(NULL, rest);
        } else if (!strcmp(op, "lookd")) {
            char *dirs = strtok(rest, ":"), *keys = strtok(NULL, "");
            do_lookup(dirs, keys);
        } else if (!strcmp(op, "unpub")) {
            size_t nk;
            char **k = NULL;
            if (strcmp(rest, "*")) k = split(rest, ",", &nk);
            rc = PMIx_Unpublish(k, NULL, 0);
            printf("UNPUBLISH status=%d\n", rc);
        } else if (!strcmp(op, "unpubd")) {
            char *dirs = strtok(rest, ":"), *keys = strtok(NULL, "");
            pmix_info_t *d = NULL;
            size_t nd = directives(dirs, &d), nk;
            char **k = split(keys, ",", &nk);
            rc = PMIx_Unpublish(k, d, nd);
            printf("UNPUBLISH status=%d\n", rc);
        } else if (!strcmp(op, "unpublong")) {
            char *k[2] = {longkey(atoi(rest)), NULL};
            rc = PMIx_Unpublish(k, NULL, 0);
            printf("UNPUBLISH status=%d\n", rc);
        } else if (!strcmp(op, "lookuplong")) {
            char *k[2] = {longkey(atoi(rest)), NULL};
            lk_done = 0;
            rc = PMIx_Lookup_nb(k, NULL, 0, lk_cb, NULL);
            if (rc == PMIX_SUCCESS) {
                while (!lk_done) usleep(1000);
                rc = lk_status;
            }
            printf("LOOKUP status=%d\n", rc);
        } else if (!strcmp(op, "put")) {
            char *key = strtok(rest, ":"), *val = strtok(NULL, "");
            pmix_value_t v;
            load(&v, "string", val);
            rc = PMIx_Put(PMIX_GLOBAL, key, &v);
            printf("PUT status=%d\n", rc);
        } else if (!strcmp(op, "commit")) {
            rc = PMIx_Commit();
            printf("COMMIT status=%d\n", rc);
        } else if (!strcmp(op, "fence")) {
            pmix_info_t info;
            bool collect = atoi(rest) != 0;
            PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
            rc = PMIx_Fence(NULL, 0, &info, 1);
            printf("FENCE status=%d\n", rc);
        } else if (!strcmp(op, "get")) {
            char *r = strtok(rest, ":"), *key = strtok(NULL, "");
            pmix_proc_t p;
            pmix_value_t *v = NULL;
            PMIX_LOAD_PROCID(&p, me.nspace, (pmix_rank_t)atoi(r));
            rc = PMIx_Get(&p, key, NULL, 0, &v);
            printf("GET status=%d ", rc);
            if (rc == PMIX_SUCCESS) print_value(v);
            printf("\n");
        } else if (!strcmp(op, "connect") || !strcmp(op, "disconnect")) {
            pmix_proc_t p;
            PMIX_LOAD_PROCID(&p, me.nspace, PMIX_RANK_WILDCARD);
            rc = op[0] == 'c' ? PMIx_Connect(&p, 1, NULL, 0) : PMIx_Disconnect(&p, 1, NULL, 0);
            printf("%s status=%d\n", op[0] == 'c' ? "CONNECT" : "DISCONNECT", rc);
        } else if (!strcmp(op, "spawn")) {
            pmix_app_t app;
            char ns[PMIX_MAX_NSLEN + 1] = "";
            char *cmd = strtok(rest, ":"), *n = strtok(NULL, "");
            PMIX_APP_CONSTRUCT(&app);
            app.cmd = strdup(cmd);
            app.argv = calloc(3, sizeof(char *));
            app.argv[0] = strdup(cmd);
            app.argv[1] = strdup("x");
            app.env = calloc(2, sizeof(char *));
            app.env[0] = strdup("X=1");
            app.cwd = strdup("/");
            app.maxprocs = atoi(n);
            rc = PMIx_Spawn(NULL, 0, &app, 1, ns);
            printf("SPAWN status=%d nspace=%s\n", rc, ns);
        } else if (!strcmp(op, "sleep")) {
            usleep(atoi(rest) * 1000);
        } else if (!strcmp(op, "waitfile")) {
            int n = 0;
            while (access(rest, F_OK) != 0 && n++ < 6000) usleep(10000);
            printf("WAITFILE found=%d\n", access(rest, F_OK) == 0);
        } else if (!strcmp(op, "nofin")) {
            fin = 0;
        } else if (!strcmp(op, "abort")) {
            rc = PMIx_Abort(atoi(rest), "test abort", NULL, 0);
            printf("ABORT status=%d\n", rc);
        } else {
            printf("UNKNOWN op=%s\n", op);
        }
        fflush(stdout);
        free(a);
    }
    if (fin) {
        rc = PMIx_Finalize(NULL, 0);
        printf("FINALIZE status=%d\n", rc);
    }
    return 0;
}
