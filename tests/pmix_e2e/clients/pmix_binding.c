/* Prints what PMIx says of each of ranks 0 and 1's binding, as rank R sees it:
 *
 *   R<rank> peer<r> <key>=<value>   (pmix.cpuset, pmix.locstr)
 *   R<rank> peer<r> <key> ERR <status>
 *
 * Under mpirun and pydvm alike a bound local rank has both keys.
 */
#include <pmix.h>
#include <stdio.h>

int main(void)
{
    pmix_proc_t me, peer;
    const char *keys[] = {PMIX_CPUSET, PMIX_LOCALITY_STRING};
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS)
        return 1;
    for (int r = 0; r < 2; r++) {
        PMIX_PROC_LOAD(&peer, me.nspace, r);
        for (int k = 0; k < 2; k++) {
            pmix_value_t *v = NULL;
            pmix_status_t rc = PMIx_Get(&peer, keys[k], NULL, 0, &v);
            if (rc == PMIX_SUCCESS && v->type == PMIX_STRING)
                printf("R%u peer%d %s=%s\n", me.rank, r, keys[k],
                       v->data.string ? v->data.string : "(null)");
            else
                printf("R%u peer%d %s ERR %s\n", me.rank, r, keys[k], PMIx_Error_string(rc));
            if (v != NULL)
                PMIX_VALUE_RELEASE(v);
        }
    }
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
