"""The ``mpirun`` options ``pydvm run`` refuses, with what to use instead, and
the "coming from mpirun" table (``docs/mpirun.md``).

:data:`NOT_SUPPORTED` names every option ``mpirun --help all`` lists that is
not in the option table (:data:`pydvm.client.options.OPTIONS`): the parser
(:mod:`pydvm.cli.runopts`) refuses one with its advice, never ignores it,
and loads this module only then.
"""

from __future__ import annotations

from ..client.options import OPTIONS

#: Every other option ``mpirun --help all`` (Open MPI 4.1.4) lists, with
#: what to use instead.  Refused with that advice, never ignored.
NOT_SUPPORTED: dict[str, str] = {
    "--rankfile": "place ranks with --host, --hostfile, --map-by and --rank-by, or an "
                  "--app file with one line per rank",
    "-rf": "place ranks with --host, --hostfile, --map-by and --rank-by",
    "--preload-binary": "pydvm starts programs where they are: install them on every node "
                        "or use a shared filesystem",
    "-s": "pydvm starts programs where they are: install them on every node",
    "--preload-files": "pydvm copies no files: use a shared filesystem",
    "--prefix": "a DVM's daemons are started by 'pydvm start' (--launcher, and the "
                "pydvm_remote_python parameter for the interpreter on remote nodes)",
    "--noprefix": "a DVM's daemons are started by 'pydvm start'",
    "--launch-agent": "'pydvm start --launcher ssh --mca plm_ssh_agent ...' starts the "
                      "daemons",
    "--hnp": "name the DVM with --dvm URI or PYDVM_URI",
    "--ompi-server": "the DVM is the name server: --dvm URI or PYDVM_URI",
    "--novm": "a one-shot DVM runs on the job's hosts only already",
    "--nolocal": "name the hosts to use with --host or --hostfile",
    "--max-vm-size": "name the hosts to use with --host or --hostfile",
    "--debug": "no debugger launch: run the job with --stop-in-init, attach a PMIx "
               "debugger to its processes (pydvm ps lists them), then 'pydvm release'",
    "--tv": "no debugger launch: run the job with --stop-in-init, attach, 'pydvm release'",
    "--debugger": "no debugger launch: run the job with --stop-in-init, attach, "
                  "'pydvm release'",
    "-d": "pydvm's own logs: 'pydvm start --log-dir D' and --mca prte_data_server_verbose 1",
    "--debug-devel": "pydvm's own logs: 'pydvm start --log-dir D'",
    "--debug-daemons": "a DVM's daemons log to 'pydvm start --log-dir D'",
    "--debug-daemons-file": "a DVM's daemons log to 'pydvm start --log-dir D'",
    "--leave-session-attached": "a DVM's daemons log to 'pydvm start --log-dir D'",
    "-v": "pydvm's own logs: 'pydvm start --log-dir D'",
    "--verbose": "pydvm's own logs: 'pydvm start --log-dir D'",
    "-V": "'pydvm --version' prints pydvm's version",
    "--version": "'pydvm --version' prints pydvm's version",
    "--xml": "no XML output: 'pydvm ps --json' describes running jobs",
    "--xml-file": "no XML output: 'pydvm ps --json' describes running jobs",
    "--xterm": "no xterm windows: --output-filename DIR keeps each rank's output apart",
    "--enable-recovery": "--no-abort-on-failure keeps the rest of a job running when a "
                         "process fails",
    "--disable-recovery": "--abort-on-failure ends the job at the first failure",
    "--max-restarts": "pydvm restarts no process: --no-abort-on-failure keeps the others "
                      "running",
    "--continuous": "--no-abort-on-failure keeps the rest of a job running",
    "--report-pid": "'pydvm ps' lists running jobs",
    "--report-uri": "'pydvm start' prints the DVM's URI",
    "--report-events": "no event reports to a tool yet",
    "--report-state-on-timeout": "--timeout names the processes still running when it "
                                 "ends a job",
    "--get-stack-traces": "no stack traces on timeout: --timeout names what still ran",
    "--report-child-jobs-separately": "a job's exit status is its own processes' already "
                                      "(spawned jobs report their failures on stderr)",
    "--show-progress": "pydvm run prints nothing while launching",
    "--index-argv-by-rank": "read PYDVM_RANK or OMPI_COMM_WORLD_RANK in the program",
    "--set-cwd-to-session-dir": "give --wdir DIR",
    "--output-proctable": "'pydvm ps --json' lists a job's nodes and ranks",
    "--display-devel-map": "--display-map",
    "--display-diffable-map": "--display-map",
    "--display-topo": "--display-map, --report-bindings",
    "--display-devel-allocation": "--display-allocation",
    "--do-not-launch": "--display-map shows the map; pydvm always launches",
    "--do-not-resolve": "pydvm resolves no interfaces for the job",
    "--use-regexp": "not needed: pydvm sends one launch message per node",
    "--fwd-mpirun-port": "not needed: a DVM's daemons connect to its master",
    "--enable-instant-on-support": "not needed",
    "--tune": "set parameters with --mca NAME VALUE or -x",
    "-am": "set parameters with --mca NAME VALUE or -x",
    "--personality": "pydvm runs Open MPI and other PMIx programs as they are",
    "-cf": "no cartography files",
    "--cartofile": "no cartography files",
}

for _name in list(NOT_SUPPORTED):  # mpirun takes every long option with one dash too
    if _name.startswith("--"):
        NOT_SUPPORTED.setdefault(_name[1:], NOT_SUPPORTED[_name])


# ----------------------------------------------------------------------
# the "coming from mpirun" table (docs/mpirun.md)
# ----------------------------------------------------------------------


def mpirun_table() -> str:
    """The Markdown table of every ``mpirun`` option and what ``pydvm run``
    does with it, made from :data:`OPTIONS` and :data:`NOT_SUPPORTED`
    (``docs/mpirun.md`` holds it; ``tests/test_cli_usage.py`` checks that it
    is this table)."""
    rows = ["| mpirun option | pydvm run | how it differs, or what to use instead |",
            "|---|---|---|"]
    for o in OPTIONS:
        if not o.mirrors:
            continue
        spellings = ", ".join(f"`{n}`" for n in o.names)
        rows.append(f"| `{o.mirrors}` | {spellings} | {o.differs or 'same meaning'} |")
    for name, advice in NOT_SUPPORTED.items():
        if name.startswith("--") or not name.startswith("-") or len(name) == 2:
            rows.append(f"| `{name}` | refused | {advice} |")
    return "\n".join(rows) + "\n"
