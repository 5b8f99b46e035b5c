/* What one rank of an MPI job sees, on one line:
 *   rank R of N on NODE cwd DIR [VAR=VALUE | VAR unset]...
 * NODE is $PYDVM_NODE under pydvm; under mpiexec.hydra (every host on this
 * machine) it is "proxy:I", I the index of the host the rank's proxy
 * stands for, read off the parent's command line (--proxy-id I). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void proxy_of_parent(char *out, size_t len)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int) getppid());
    snprintf(out, len, "unknown");
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (strcmp(buf + i, "--proxy-id") == 0 && i + strlen(buf + i) + 1 < n) {
            snprintf(out, len, "proxy:%s", buf + i + strlen(buf + i) + 1);
            return;
        }
}

int main(int argc, char **argv)
{
    int rank, size;
    char node[256], cwd[4096], line[16384];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *pn = getenv("PYDVM_NODE");
    if (pn)
        snprintf(node, sizeof node, "%s", pn);
    else
        proxy_of_parent(node, sizeof node);
    if (!getcwd(cwd, sizeof cwd))
        snprintf(cwd, sizeof cwd, "?");
    int off = snprintf(line, sizeof line, "rank %d of %d on %s cwd %s", rank, size, node, cwd);
    for (int i = 1; i < argc && off < (int) sizeof line - 1; i++) {
        const char *v = getenv(argv[i]);
        off += snprintf(line + off, sizeof line - off, v ? " %s=%s" : " %s unset", argv[i],
                        v ? v : "");
    }
    if (off > (int) sizeof line - 2)
        off = (int) sizeof line - 2;
    line[off++] = '\n';
    /* one write: launchers forward output in chunks, not lines */
    if (write(1, line, off) != off)
        return 1;
    MPI_Finalize();
    return 0;
}
