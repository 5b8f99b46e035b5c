/* PMIx_Query_info from a client of a job, one query per argument.
 *
 *   pmix_query KEY[@NSPACE] ...     (NSPACE "self": this process's namespace)
 *
 * Prints (each line after "R<rank> "), per query:
 *   QUERY key=K status=S n=N
 *   VALUE key=K type=T value=V          (string, integer types, status)
 *   NSINFO key=K nspace=NS cmd=CMD      (one per namespace)
 *   PROC key=K nspace=NS rank=R host=H exe=E pid=P exit=X state=S
 * and checks each answered value's type against the one pmix_common.h
 * (OpenPMIx 4.2.2) gives the key: a wrong type prints BADTYPE and makes the
 * program exit 3.  Also prints ME nspace=NS rank=R pid=P, and FENCE status=S
 * of the fence of the whole job it waits in before finalizing. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int bad = 0;
static unsigned myrank = 0;

/* every line starts with the rank: the ranks' outputs interleave */
#define OUT(...) (printf("R%u ", myrank), printf(__VA_ARGS__))

static pmix_data_type_t expected(const char *key)
{
    if (!strcmp(key, PMIX_QUERY_NAMESPACES) || !strcmp(key, PMIX_QUERY_SPAWN_SUPPORT) ||
        !strcmp(key, PMIX_QUERY_DEBUG_SUPPORT) || !strcmp(key, PMIX_QUERY_PSET_NAMES) ||
        !strcmp(key, PMIX_NODE_LIST) || !strcmp(key, PMIX_QUERY_SUPPORTED_KEYS))
        return PMIX_STRING;
    if (!strcmp(key, PMIX_JOB_SIZE) || !strcmp(key, PMIX_NUM_NODES))
        return PMIX_UINT32;
    if (!strcmp(key, PMIX_QUERY_NUM_PSETS))
        return PMIX_SIZE;
    if (!strcmp(key, PMIX_QUERY_JOB_STATUS))
        return PMIX_STATUS;
    return PMIX_DATA_ARRAY;
}

static void show(const pmix_info_t *info)
{
    const pmix_value_t *v = &info->value;
    size_t i;

    if (v->type != expected(info->key)) {
        OUT("BADTYPE key=%s type=%s\n", info->key, PMIx_Data_type_string(v->type));
        bad = 1;
        return;
    }
    switch (v->type) {
    case PMIX_STRING:
        OUT("VALUE key=%s type=%d value=%s\n", info->key, v->type,
               v->data.string ? v->data.string : "(null)");
        break;
    case PMIX_UINT32:
        OUT("VALUE key=%s type=%d value=%u\n", info->key, v->type, v->data.uint32);
        break;
    case PMIX_SIZE:
        OUT("VALUE key=%s type=%d value=%zu\n", info->key, v->type, v->data.size);
        break;
    case PMIX_STATUS:
        OUT("VALUE key=%s type=%d value=%d\n", info->key, v->type, v->data.status);
        break;
    case PMIX_DATA_ARRAY: {
        pmix_data_array_t *da = v->data.darray;
        if (da->type == PMIX_PROC_INFO) {
            pmix_proc_info_t *p = (pmix_proc_info_t *) da->array;
            for (i = 0; i < da->size; i++)
                OUT("PROC key=%s nspace=%s rank=%u host=%s exe=%s pid=%d exit=%d state=%d\n",
                       info->key, p[i].proc.nspace, p[i].proc.rank, p[i].hostname,
                       p[i].executable_name, (int) p[i].pid, p[i].exit_code, (int) p[i].state);
        } else if (da->type == PMIX_INFO && !strcmp(info->key, PMIX_QUERY_NAMESPACE_INFO)) {
            pmix_info_t *rows = (pmix_info_t *) da->array;
            for (i = 0; i < da->size; i++) {
                pmix_data_array_t *inner = rows[i].value.data.darray;
                pmix_info_t *f = (pmix_info_t *) inner->array;
                const char *ns = "?", *cmd = "?";
                size_t k;
                for (k = 0; k < inner->size; k++) {
                    if (PMIX_CHECK_KEY(&f[k], PMIX_NSPACE)) ns = f[k].value.data.string;
                    if (PMIX_CHECK_KEY(&f[k], PMIX_CMD_LINE)) cmd = f[k].value.data.string;
                }
                OUT("NSINFO key=%s nspace=%s cmd=%s\n", info->key, ns, cmd);
            }
        } else {
            OUT("BADTYPE key=%s array of %s\n", info->key, PMIx_Data_type_string(da->type));
            bad = 1;
        }
        break;
    }
    default:
        OUT("BADTYPE key=%s type=%s\n", info->key, PMIx_Data_type_string(v->type));
        bad = 1;
    }
}

int main(int argc, char **argv)
{
    pmix_proc_t me;
    pmix_status_t rc;
    int a;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (PMIX_SUCCESS != (rc = PMIx_Init(&me, NULL, 0))) {
        myrank = 0;
        OUT("INIT status=%d\n", rc);
        return 1;
    }
    myrank = me.rank;
    OUT("ME nspace=%s rank=%u pid=%d\n", me.nspace, me.rank, (int) getpid());
    for (a = 1; a < argc; a++) {
        pmix_query_t *q;
        pmix_info_t *results = NULL;
        size_t nresults = 0, i;
        char key[PMIX_MAX_KEYLEN + 1], *at;

        snprintf(key, sizeof(key), "%s", argv[a]);
        PMIX_QUERY_CREATE(q, 1);
        at = strchr(key, '@');
        if (at != NULL) {
            *at++ = '\0';
            PMIX_QUERY_QUALIFIERS_CREATE(q, 1);
            PMIX_INFO_LOAD(&q->qualifiers[0], PMIX_NSPACE,
                           strcmp(at, "self") ? at : me.nspace, PMIX_STRING);
        }
        PMIX_ARGV_APPEND(rc, q->keys, key);
        rc = PMIx_Query_info(q, 1, &results, &nresults);
        OUT("QUERY key=%s status=%d n=%zu\n", key, rc, nresults);
        for (i = 0; i < nresults; i++)
            show(&results[i]);
        if (results != NULL)
            PMIX_INFO_FREE(results, nresults);
        PMIX_QUERY_FREE(q, 1);
    }
    /* every rank stays until all have asked: a process table then shows
     * them all running */
    rc = PMIx_Fence(NULL, 0, NULL, 0);
    OUT("FENCE status=%d\n", rc);
    PMIx_Finalize(NULL, 0);
    return bad ? 3 : 0;
}
