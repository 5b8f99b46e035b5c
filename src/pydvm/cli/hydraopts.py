"""The options of MPICH's ``mpiexec`` (Hydra; Intel MPI's is Hydra too) that
``pydvm run`` refuses, with what to use instead, and the "coming from
mpiexec" table (``docs/mpiexec.md``).

The Hydra options ``pydvm run`` takes are in the option table
(:data:`pydvm.client.options.OPTIONS`, their ``hydra`` field); every other
option ``mpiexec --help`` lists is in :data:`HYDRA_NOT_SUPPORTED`, which the
parser (:mod:`pydvm.cli.runopts`) refuses with its advice and loads only
then.
"""

from __future__ import annotations

from ..client.options import OPTIONS
from .mpirunopts import NOT_SUPPORTED

_LAUNCH = "a DVM's daemons are started by 'pydvm start' (--launcher local|ssh, or in a Slurm " \
          "allocation)"
#: Every other option ``mpiexec --help`` (MPICH 4.0's Hydra) lists, and the
#: older spellings it still takes, with what to use instead: refused with
#: that advice, never ignored.  (``-v``/``-verbose`` are mpirun's too: see
#: :data:`NOT_SUPPORTED`.)
HYDRA_NOT_SUPPORTED: dict[str, str] = {
    "-launcher": _LAUNCH,
    "-bootstrap": _LAUNCH,
    "-launcher-exec": _LAUNCH,
    "-bootstrap-exec": _LAUNCH,
    "-enable-x": "no X forwarding",
    "-disable-x": "no X forwarding: there is none to disable",
    "-rmk": "'pydvm start' inside a Slurm allocation takes its nodes; else name them with "
            "-hosts or -f",
    "-topolib": "pydvm reads each node's topology itself (hwloc's view, from /sys)",
    "-membind": "no memory binding: --bind-to numa keeps a process on one NUMA domain",
    "-binding": "bind with --bind-to core|socket|numa|hwthread|none, or --cpu-set LIST",
    "-demux": "not needed",
    "-info": "'pydvm --version' prints pydvm's version, 'pydvm info' the DVM's parameters",
    "-print-all-exitcodes": "pydvm run names every process that failed (rank, node, exit "
                            "status) on stderr already",
    "-iface": "the DVM's network is 'pydvm start's; MPICH's own interface choice is its "
              "environment's (-genv MPIR_CVAR_CH4_NETMOD ... or FI_PROVIDER)",
    "-profile": "not supported",
    "-prepend-rank": "--tag-output prefixes each line with [JOB,RANK]",
    "-l": "--tag-output prefixes each line with [JOB,RANK]",
    "-prepend-pattern": "--tag-output or --timestamp-output prefix each line",
    "-outfile-pattern": "--output-filename DIR writes each rank's output to "
                        "DIR/JOB/rank.N/stdout",
    "-errfile-pattern": "--output-filename DIR writes each rank's errors to "
                        "DIR/JOB/rank.N/stderr",
    "-nameserver": "the DVM is the name server: --dvm URI or PYDVM_URI",
    "-disable-auto-cleanup": "--no-abort-on-failure keeps the rest of a job running when a "
                             "process fails",
    "-enable-auto-cleanup": "--abort-on-failure ends the job at the first failure",
    "-disable-hostname-propagation": "not needed: pydvm tells no process its host name",
    "-enable-hostname-propagation": "not needed: pydvm tells no process its host name",
    "-order-nodes": "list the hosts in the order wanted with -hosts or -f",
    "-localhost": "'pydvm start' names the nodes",
    "-usize": "the universe is the job's session: 'pydvm session new --hosts ...'",
    "-pmi-port": "PMI-1 is served on every node already (--mpi pmi1)",
    "-skip-launch-node": "name the hosts to use with -hosts or -f",
    "-gpus-per-proc": "give each process its GPUs in its environment (-env "
                      "CUDA_VISIBLE_DEVICES ...) or from the program",
    "-ranks-per-proc": "one rank per process",
    "-machine": "name the hosts with -hosts H[:SLOTS],.. or -f FILE",
    "-machines": "name the hosts with -hosts H[:SLOTS],.. or -f FILE",
    "-machinelist": "name the hosts with -hosts H[:SLOTS],.. or -f FILE",
}

for _name in list(HYDRA_NOT_SUPPORTED):  # mpiexec takes each with two dashes too
    HYDRA_NOT_SUPPORTED.setdefault("-" + _name, HYDRA_NOT_SUPPORTED[_name])


# ----------------------------------------------------------------------
# the "coming from mpiexec" table (docs/mpiexec.md)
# ----------------------------------------------------------------------


def mpiexec_table() -> str:
    """The Markdown table of every option of MPICH's ``mpiexec`` (Hydra,
    MPICH 4.0) and what ``pydvm run`` does with it, made from
    :data:`OPTIONS` and :data:`HYDRA_NOT_SUPPORTED` (``docs/mpiexec.md``
    holds it; ``tests/test_cli_usage.py`` checks that it is this table)."""
    rows = ["| mpiexec option | pydvm run | how it differs, or what to use instead |",
            "|---|---|---|"]
    for o in OPTIONS:
        if not o.hydra:
            continue
        spellings = ", ".join(f"`{n}`" for n in o.names)
        rows.append(f"| `{o.hydra}` | {spellings} | {o.hydra_differs or 'same meaning'} |")
    for name in ("-v", "-verbose"):
        rows.append(f"| `{name}` | refused | {NOT_SUPPORTED[name]} |")
    for name, advice in HYDRA_NOT_SUPPORTED.items():
        if not name.startswith("--"):
            rows.append(f"| `{name}` | refused | {advice} |")
    return "\n".join(rows) + "\n"
