"""Every option of ``pydvm run``, declared once, and the parser that reads them.

An :class:`Opt` says an option's spellings, how many arguments it takes,
whether it belongs to the whole job or to the app context it is written in,
its help text, and which ``mpirun`` option it mirrors (Open MPI 4.1's
spelling, or ``""`` for pydvm's own).  ``pydvm run --help``
(:func:`run_help`), the "coming from mpirun" page (``docs/mpirun.md``) and
the parity tests are checked against this table
(``tests/test_cli_usage.py``), and :data:`NOT_SUPPORTED` names every other
option ``mpirun --help all`` lists, with what to use instead: no ``mpirun``
option is ever ignored silently.

This module is on the fast path of every ``pydvm run``: it imports nothing
but the protocol's host-list reader; the placement parsers
(:mod:`pydvm.placement`) and the parameter registry are loaded only by
the options that need them.
"""

from __future__ import annotations

import os

from ..protocol import parse_host_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Where an option belongs: the whole job (before the first command), the
#: app context it is written in, or the whole job from any app context
#: (mpiexec's global options).
JOB, APP, GLOBAL = "job", "app", "global"

#: ``nargs`` of an option that takes ``NAME VALUE`` or ``NAME=VALUE``
#: (mpiexec's ``-genv``, ``-env``).
PAIR = -2


class Opt:
    """One option: ``names`` (every spelling accepted, the first shown in
    help), ``nargs`` (0, 1 or 2), ``scope`` (:data:`JOB`: before the first
    command only; :data:`APP`: in the context it is written in), ``key``
    (what it sets), ``metavar``, ``help``, ``mirrors`` (the ``mpirun``
    option of the same meaning, ``""`` if none), ``differs`` (how pydvm's
    meaning differs from ``mpirun``'s, ``""`` if it does not), ``hydra``
    (the option of MPICH's ``mpiexec`` -- Hydra, which Intel MPI's is too --
    it stands for, ``""`` if none) and ``hydra_differs`` (how pydvm's meaning
    differs from that one's).  :data:`GLOBAL` options are the whole job's but
    may be written in any app context, as Hydra's global options may."""

    __slots__ = ("names", "nargs", "scope", "key", "metavar", "help", "mirrors", "differs",
                 "hydra", "hydra_differs")

    def __init__(self, names: tuple[str, ...], nargs: int, scope: str, key: str, help: str,
                 metavar: str = "", mirrors: str = "", differs: str = "", hydra: str = "",
                 hydra_differs: str = "") -> None:
        self.names = names
        self.nargs = nargs
        self.scope = scope
        self.key = key
        self.metavar = metavar
        self.help = help
        self.mirrors = mirrors
        self.differs = differs
        self.hydra = hydra
        self.hydra_differs = hydra_differs


OPTIONS: tuple[Opt, ...] = (
    # -- pydvm's own ---------------------------------------------------------
    Opt(("--dvm",), 1, JOB, "dvm", "submit to this DVM (default $PYDVM_URI); with neither, "
        "run a one-shot DVM on this machine for this job alone (it warns on stderr if it "
        "ends holding data a persistent DVM would have kept)", "URI"),
    Opt(("--session",), 1, JOB, "session", "run in session ID ('pydvm session new'; default: "
        "the DVM's default session); needs a persistent DVM", "ID"),
    Opt(("--queue",), 0, JOB, "queue",
        "if the job does not fit the slots free now, wait at the DVM for them (in "
        "submission order; 'pydvm ps' shows it queued) instead of oversubscribing at once; "
        "a job larger than its hosts' slots is refused (default: the DVM's pydvm_queue "
        "parameter, off); needs a persistent DVM"),
    Opt(("--no-queue",), 0, JOB, "no_queue",
        "start at once even if the DVM queues jobs by default (pydvm_queue on)"),
    Opt(("--abort-on-failure",), 0, JOB, "abort_on_failure",
        "kill the rest of the job when one process fails"),
    Opt(("--no-abort-on-failure",), 0, JOB, "no_abort_on_failure",
        "never: a failing process does not end its siblings (default: as mpirun for an "
        "MPI/PMIx job -- one run with --pmix, or a failing process that called PMIx_Init -- "
        "and never for other jobs; their PMIx processes that asked are told of the failure "
        "first)"),
    Opt(("--stop-in-init",), 0, JOB, "stop_in_init",
        "start the job stopped for a debugger: each process that calls PMIx_Init waits "
        "there until 'pydvm release NSPACE' (or a PMIx tool's PMIX_DEBUGGER_RELEASE event) "
        "lets it go on; 'pydvm ps' shows the job stopped until then"),
    Opt(("--pmix",), 0, JOB, "pmix", "the job needs PMIx: refuse it unless every node it runs "
        "on hosts a PMIx server (see 'pydvm info'); without it, PMIx clients are served "
        "wherever libpmix is available.  A process of it that exits non-zero, is killed, or "
        "ends without finalizing PMIx ends the job"),
    Opt(("--mpi",), 1, JOB, "mpi", "the interface the job's processes find their launcher "
        "through, as Slurm's srun --mpi: 'pmix' (Open MPI, PMIx programs), 'pmi1' (MPICH, "
        "Intel MPI, MVAPICH: PMI-1 on every node), 'none', or 'auto' -- read off the "
        "program: PMI-1 for one linked to the MPICH family's libmpi, PMIx otherwise "
        "(default: the DVM's pydvm_mpi parameter, auto)", "auto|pmix|pmi1|none"),
    # -- parameters ------------------------------------------------------------
    Opt(("--mca", "-mca", "--gmca", "-gmca"), 2, JOB, "mca",
        "a parameter pydvm knows ('pydvm info' lists them) sets the one-shot DVM (a "
        "persistent DVM takes them on 'pydvm start'); any other name is Open MPI's, given "
        "to every process as OMPI_MCA_NAME=VALUE", "NAME VALUE", "--mca",
        "pydvm's own parameter names (prte_*, pydvm_*) configure the DVM instead"),
    # -- output ------------------------------------------------------------------
    Opt(("--tag-output", "-tag-output"), 0, JOB, "tag_output",
        "prefix each output line with [NSPACE,RANK]", "", "--tag-output",
        "the tag names the job's namespace, '[pydvm-...@1,0] ', where mpirun writes "
        "'[1,0]<stdout>:'"),
    Opt(("--timestamp-output", "-timestamp-output"), 0, JOB, "timestamp_output",
        "prefix each output line with the time and its stream, as mpirun does "
        "('Thu Dec  3 19:29:31 2026<stdout>:')", "", "--timestamp-output"),
    Opt(("--merge-stderr-to-stdout", "-merge-stderr-to-stdout"), 0, JOB, "merge_stderr",
        "write every process's stderr to pydvm run's stdout (and, with --output-filename, "
        "to its rank.N/stdout file)", "", "--merge-stderr-to-stdout",
        "mpirun 4.1 leaves stderr on stderr unless the output is a terminal; pydvm always "
        "merges"),
    Opt(("--output-filename", "-output-filename"), 1, JOB, "output_filename",
        "also write each rank's output to DIR/1/rank.N/stdout and stderr (1: this run's job, "
        "as under mpirun, on any DVM; 2, 3 ...: the jobs it spawns)", "DIR",
        "--output-filename", "mpirun 4.1.4 writes no files for the jobs a job spawns"),
    Opt(("--stdin", "-stdin"), 1, JOB, "stdin",
        "which rank reads pydvm run's stdin: a rank number (default 0), 'all' (every "
        "rank) or 'none'", "RANK|all|none", "--stdin",
        "'all' works wherever the ranks run; mpirun 4.1.4 hangs with it when a rank runs on "
        "mpirun's own node"),
    Opt(("-q", "--quiet"), 0, JOB, "quiet",
        "no report of failed processes and no warnings on stderr: the exit status says it",
        "", "--quiet", "what it quiets is pydvm run's report of failed processes and its "
        "warnings"),
    # -- control -----------------------------------------------------------------
    Opt(("--timeout", "-timeout"), 1, JOB, "timeout",
        "end the job after SECONDS, naming what still ran, and exit 110 (as mpirun; "
        "default $MPIEXEC_TIMEOUT, else no limit)", "SECONDS", "--timeout",
        "the report names every process still running (rank and node) on one line"),
    Opt(("--allow-run-as-root", "-allow-run-as-root"), 0, JOB, "allow_run_as_root",
        "accepted for mpirun's command lines: pydvm runs jobs as root without it", "",
        "--allow-run-as-root", "root needs no permission"),
    Opt(("--app", "-app"), 1, JOB, "app_file",
        "read the app contexts from FILE, one a line ('-n 2 ./a.out'; '#' starts a "
        "comment); the command line then names no command", "FILE", "--app",
        "a line is split as a shell splits it (mpirun 4.1 splits at blanks, quotes and all); "
        "options of the whole job stay on the command line"),
    # -- placement -----------------------------------------------------------------
    Opt(("--hostfile", "-hostfile", "--machinefile", "-machinefile", "--default-hostfile",
         "-default-hostfile"), 1, JOB, "hostfile",
        "the hosts of apps without --host, in Open MPI's format ('host slots=N "
        "max_slots=M', '#' comments); each must be a node of the DVM (a one-shot DVM is made "
        "of them)", "FILE", "--hostfile", hydra="-hostfile",
        hydra_differs="Open MPI's format ('host slots=N'), as mpirun reads it (so is "
        "-machinefile): give Hydra's ('host:N' lines) with -f"),
    Opt(("--map-by", "-map-by"), 1, JOB, "map_by",
        "how ranks are laid out: slot (default), node, core, socket, numa, hwthread, "
        "l3cache, ppr:N:RESOURCE; modifiers :PE=n, :SPAN, :OVERSUBSCRIBE, :NOOVERSUBSCRIBE",
        "POLICY", "--map-by", hydra="-map-by",
        hydra_differs="mpirun's policies (slot, node, core, socket, numa, ppr:N:R ...); "
        "Hydra's others (hwthread:N counts, user lists) are refused"),
    Opt(("--rank-by", "-rank-by"), 1, JOB, "rank_by",
        "the order ranks are numbered in: slot, node, core, socket, numa, hwthread, l3cache",
        "POLICY", "--rank-by"),
    Opt(("-N", "--npernode", "-npernode"), 1, JOB, "npernode",
        "N processes on every node (of --host, the hostfile, or the session)", "N",
        "-N"),
    Opt(("--pernode", "-pernode"), 0, JOB, "pernode", "one process on every node", "",
        "--pernode"),
    Opt(("--npersocket", "-npersocket"), 1, JOB, "npersocket",
        "N processes on every socket (--map-by ppr:N:socket)", "N", "--npersocket"),
    Opt(("--ppr", "-ppr"), 1, JOB, "ppr", "N processes per RESOURCE (--map-by ppr:N:RESOURCE)",
        "N:RESOURCE", "--ppr"),
    Opt(("--bynode", "-bynode"), 0, JOB, "bynode", "--map-by node (mpirun's older spelling)",
        "", "--bynode"),
    Opt(("--byslot", "-byslot"), 0, JOB, "byslot", "--map-by slot (mpirun's older spelling)",
        "", "--byslot"),
    Opt(("--bycore", "-bycore"), 0, JOB, "bycore", "--map-by core (mpirun's older spelling)",
        "", "--bycore"),
    Opt(("--cpus-per-proc", "-cpus-per-proc", "--cpus-per-rank", "-cpus-per-rank"), 1, JOB,
        "pe", "CPUs of each process (--map-by ...:PE=n)", "N", "--cpus-per-proc"),
    Opt(("--oversubscribe", "-oversubscribe"), 0, JOB, "oversubscribe",
        "allow more processes on a node than its slots (the default: see "
        "--nooversubscribe)", "", "--oversubscribe"),
    Opt(("--nooversubscribe", "-nooversubscribe"), 0, JOB, "nooversubscribe",
        "refuse a job that needs more slots than its hosts have, as mpirun does by default",
        "", "--nooversubscribe",
        "pydvm's default allows oversubscription (ranks wrap around the slots): pydvm's "
        "fixed command-line contract"),
    Opt(("--display-map", "-display-map"), 0, JOB, "display_map",
        "print where each rank goes before the job starts", "", "--display-map"),
    Opt(("--display-allocation", "-display-allocation"), 0, JOB, "display_allocation",
        "print the nodes and slots the job may use before it starts", "",
        "--display-allocation"),
    # -- binding -------------------------------------------------------------------
    Opt(("--bind-to", "-bind-to"), 1, JOB, "bind_to",
        "bind each process to a none, hwthread, core, l3cache, numa or socket "
        "(:overload-allowed lets several share one); default: core for a job of up to 2 "
        "processes, socket above, none on a node it oversubscribes", "WHAT", "--bind-to",
        hydra="-bind-to", hydra_differs="mpirun's targets (none, core, socket, numa, "
        "hwthread, l3cache) and mpirun's default (bound, where Hydra binds nothing unless "
        "asked); Hydra's user:LIST and counts (core:2) are refused"),
    Opt(("--bind-to-core", "-bind-to-core"), 0, JOB, "bind_to_core",
        "--bind-to core (mpirun's older spelling)", "", "--bind-to-core"),
    Opt(("--bind-to-socket", "-bind-to-socket"), 0, JOB, "bind_to_socket",
        "--bind-to socket (mpirun's older spelling)", "", "--bind-to-socket"),
    Opt(("--report-bindings", "-report-bindings"), 0, JOB, "report_bindings",
        "print each process's binding on stderr, one line a rank, as mpirun does", "",
        "--report-bindings"),
    Opt(("--cpu-set", "-cpu-set", "--cpu-list", "-cpu-list"), 1, JOB, "cpu_set",
        "use only these logical CPUs of each node (e.g. 0,2-3)", "LIST", "--cpu-set"),
    Opt(("--use-hwthread-cpus", "-use-hwthread-cpus"), 0, JOB, "use_hwthread_cpus",
        "count hardware threads, not cores, as CPUs", "", "--use-hwthread-cpus"),
    # -- mpiexec's (MPICH's Hydra; Intel MPI's is Hydra too) -------------------------------
    Opt(("-hosts", "--hosts", "-hostlist", "--hostlist"), 1, GLOBAL, "hosts",
        "the hosts of every app context without --host, in order, one slot each unless "
        ":SLOTS is given; without -n a context runs one process per slot", "H[:SLOTS],..",
        hydra="-hosts"),
    Opt(("-f",), 1, GLOBAL, "hydra_hostfile",
        "as -hosts, read from FILE in mpiexec's format: one host a line, 'host' or "
        "'host:SLOTS' ('#' comments)", "FILE", hydra="-f"),
    Opt(("-ppn", "--ppn"), 1, GLOBAL, "ppn",
        "N processes per node: every host of an app counts N slots (ranks fill N on a host, "
        "then the next, wrapping around); without -n a context runs N on each host", "N",
        hydra="-ppn"),
    Opt(("-genv", "--genv"), PAIR, GLOBAL, "genv",
        "give every process NAME=VALUE (repeatable; -env and -x of a context win)",
        "NAME VALUE", hydra="-genv"),
    Opt(("-genvlist", "--genvlist"), 1, GLOBAL, "genvlist",
        "pass only these variables of this environment (with -genv's, -env's): the "
        "processes start from their node's environment (the pydvm daemon's), as mpiexec's "
        "start from its proxy's", "A,B,..", hydra="-genvlist",
        hydra_differs="the node's environment is its pydvm daemon's (for another user's "
        "job on a shared DVM: only PATH, HOME, USER, LOGNAME and SHELL)"),
    Opt(("-genvnone", "--genvnone"), 0, GLOBAL, "genvnone",
        "pass none of this environment (only -genv's and -env's): the processes start from "
        "their node's environment, as -genvlist", "", hydra="-genvnone",
        hydra_differs="as -genvlist"),
    Opt(("-genvall", "--genvall"), 0, GLOBAL, "genvall",
        "pass all of this environment (the default)", "", hydra="-genvall"),
    Opt(("-configfile", "--configfile"), 1, JOB, "configfile",
        "read the app contexts from FILE, one a line, options (mpiexec's and mpirun's, "
        "of the whole job too) then command; '#' starts a comment; the command line then "
        "names no command", "FILE", hydra="-configfile",
        hydra_differs="a line is split as a shell splits it (mpiexec splits at blanks)"),
    # -- each app context --------------------------------------------------------------
    Opt(("-n", "--np", "-np", "-c", "--n"), 1, APP, "n",
        "number of processes (default 1; with -N, ppr or a hostfile, as mpirun derives "
        "it)", "N", "-n", "without -n, -N, --ppr or a hostfile pydvm runs one process; "
        "mpirun one per slot", hydra="-n",
        hydra_differs="without -n, -ppn, -hosts or a host file pydvm runs one process; "
        "mpiexec one per core of this machine"),
    Opt(("--host", "-H", "-host"), 1, APP, "host",
        "hosts this app's ranks fill, in order, SLOTS at a time (default: every host of the "
        "session, and its slots)", "H[:SLOTS],..", "--host", hydra="-host",
        hydra_differs="as mpirun's --host, the hosts of the app context it is written in; "
        "mpiexec's -host (as its -hosts) gives every context's: write -hosts for that"),
    Opt(("-x",), 1, APP, "x",
        "give the processes VAR, with VALUE or with its value here (repeatable)",
        "VAR[=VALUE]", "-x"),
    Opt(("-env", "--env"), PAIR, APP, "env",
        "give this context's processes NAME=VALUE (repeatable; as -x NAME=VALUE)",
        "NAME VALUE", hydra="-env"),
    Opt(("-envlist", "--envlist"), 1, APP, "envlist",
        "-genvlist for this context alone (it wins over the global choice)", "A,B,..",
        hydra="-envlist", hydra_differs="as -genvlist"),
    Opt(("-envnone", "--envnone"), 0, APP, "envnone",
        "-genvnone for this context alone", "", hydra="-envnone",
        hydra_differs="as -genvlist"),
    Opt(("-envall", "--envall"), 0, APP, "envall",
        "-genvall for this context alone", "", hydra="-envall"),
    Opt(("--wdir", "-wdir", "--wd", "-wd"), 1, APP, "wdir",
        "the processes' working directory (default: this one)", "DIR", "--wdir",
        hydra="-wdir"),
    Opt(("--path", "-path"), 1, APP, "path",
        "look for the program in DIR first (put before the processes' PATH)", "DIR",
        "--path"),
)

#: spelling -> its declaration
BY_NAME: dict[str, Opt] = {name: o for o in OPTIONS for name in o.names}

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
# parsing
# ----------------------------------------------------------------------


def _count(opt: str, text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"{opt} needs a number, not {text!r}") from None
    if v < 1:
        raise ValueError(f"{opt} must be at least 1")
    return v


def _seconds(opt: str, text: str) -> float:
    import math

    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{opt} needs a number of seconds, not {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{opt} must be a number of seconds > 0, not {text}")
    return v


def _new_app() -> dict[str, Any]:
    return {"n": None, "hosts": None, "env": {}, "cwd": None, "path": None, "env_from": None}


def _env_names(opt: str, text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any("=" in n for n in names):
        raise ValueError(f"{opt} needs a list of variable names (A,B,..), not {text!r}")
    return names


def _segment(seg: list[str], idx: int, opts: dict, app: dict, where: str,
             job_ok: bool) -> list[str]:
    """Read the options at the head of one app context (``seg``) into
    ``opts`` (the job's) and ``app`` (the context's); return its command."""
    i = 0
    while i < len(seg) and seg[i].startswith("-") and seg[i] != "-":
        tok = seg[i]
        if tok == "--":
            i += 1
            break
        name, eq, inline = tok.partition("=")
        o = BY_NAME.get(name)
        if o is None:
            if name in NOT_SUPPORTED:
                raise ValueError(f"{name} (an mpirun option) is not supported{where}: "
                                 f"{NOT_SUPPORTED[name]}")
            if name in HYDRA_NOT_SUPPORTED:
                raise ValueError(f"{name} (an mpiexec option) is not supported{where}: "
                                 f"{HYDRA_NOT_SUPPORTED[name]}")
            raise ValueError(f"unknown option {tok}{where}")
        if o.scope == JOB and not job_ok:
            raise ValueError(f"{name} applies to the whole job: give it before the first "
                             f"command, not{where}")
        args: list[str] = []
        if o.nargs == 0:
            if eq:
                raise ValueError(f"{name} takes no value")
        elif o.nargs == PAIR:
            # NAME VALUE, or NAME=VALUE in one word (as mpiexec reads them)
            if eq or i + 1 >= len(seg):
                raise ValueError(f"{name} needs {o.metavar} (or NAME=VALUE)")
            var, eq2, value = seg[i + 1].partition("=")
            if eq2:
                args = [var, value]
                i += 1
            elif i + 2 >= len(seg):
                raise ValueError(f"{name} {seg[i + 1]} needs a value: {name} {o.metavar}")
            else:
                args = seg[i + 1:i + 3]
                i += 2
        elif eq:
            if o.nargs == 2:
                raise ValueError(f"{name} takes two arguments: {o.metavar}")
            args = [inline]
        else:
            if i + o.nargs >= len(seg):
                raise ValueError(f"{name} needs {'a value' if o.nargs == 1 else o.metavar}")
            args = seg[i + 1:i + 1 + o.nargs]
            i += o.nargs
        _apply(o, name, args, opts, app)
        i += 1
    return seg[i:]


def _placement(opts: dict, key: str, value: Any, name: str) -> None:
    place = opts["placement"]
    if key in place and place[key] != value:
        raise ValueError(f"{name} contradicts an earlier placement option")
    place[key] = value


def _apply(o: Opt, name: str, args: list[str], opts: dict, app: dict) -> None:
    """What option ``o`` (written ``name``) with ``args`` does."""
    k = o.key
    v = args[0] if args else ""
    if k == "n":
        app["n"] = _count("-n", v)
    elif k == "host":
        app["hosts"] = [[h, slots] for h, slots in parse_host_list(v)]
    elif k == "x":
        var, eq, value = v.partition("=")
        if not var:
            raise ValueError(f"-x needs VAR or VAR=VALUE, not {v!r}")
        if not eq:
            if var not in os.environ:
                opts["warnings"].append(f'could not find environment variable "{var}" (-x)')
                return
            value = os.environ[var]
        app["env"][var] = value
    elif k == "env":
        if not args[0]:
            raise ValueError(f"{name} needs a variable name, not {args[0]!r}")
        app["env"][args[0]] = args[1]
    elif k == "genv":
        if not args[0]:
            raise ValueError(f"{name} needs a variable name, not {args[0]!r}")
        opts["genv"][args[0]] = args[1]
    elif k in ("genvall", "genvnone", "genvlist", "envall", "envnone", "envlist"):
        holder = opts if k.startswith("g") else app
        choice = _env_names(name, v) if k.endswith("list") else k[-3:] if k.endswith("all") \
            else "none"
        if holder["env_from"] is not None:
            trio = "-genvall, -genvnone, -genvlist" if holder is opts else \
                "-envall, -envnone, -envlist"
            raise ValueError(f"{name}: give one of {trio}, once")
        holder["env_from"] = choice
    elif k in ("hosts", "hydra_hostfile"):
        from ..placement import read_hydra_hostfile

        if opts["hostfile"] is not None:
            raise ValueError(f"{name}: give the hosts once (--hostfile, -f or -hosts)")
        opts["hostfile"] = [[h, slots] for h, slots in parse_host_list(v)] \
            if k == "hosts" else read_hydra_hostfile(v)
        opts["placement"]["wrap"] = "job"  # contexts go on where the last ended
    elif k == "ppn":
        _placement(opts, "ppn", _count(name, v), name)
        opts["placement"]["wrap"] = "job"
    elif k == "configfile":
        if opts["app_file"] is not None:
            raise ValueError("give one --app or -configfile")
        opts["app_file"], opts["app_file_opt"] = v, name
    elif k == "wdir":
        app["cwd"] = os.path.abspath(v)
    elif k == "path":
        app["path"] = os.path.abspath(v)
    elif k == "dvm":
        opts["dvm"] = v
    elif k == "session":
        try:
            opts["session"] = int(v)
        except ValueError:
            raise ValueError(f"--session needs a session id, not {v!r}") from None
    elif k == "mca":
        opts["mca"].append((args[0], args[1]))
    elif k in ("abort_on_failure", "no_abort_on_failure"):
        want = k == "abort_on_failure"
        if opts["abort_on_failure"] is not None and opts["abort_on_failure"] != want:
            raise ValueError("--abort-on-failure and --no-abort-on-failure contradict each "
                             "other")
        opts["abort_on_failure"] = want
    elif k in ("queue", "no_queue"):
        want = k == "queue"
        if opts["queue"] is not None and opts["queue"] != want:
            raise ValueError("give --queue or --no-queue, not both")
        opts["queue"] = want
    elif k in ("pmix", "stop_in_init", "tag_output", "timestamp_output", "merge_stderr", "quiet",
               "allow_run_as_root"):
        opts[k] = True
    elif k == "mpi":
        if v not in ("auto", "pmix", "pmi1", "none"):
            raise ValueError(f"--mpi takes auto, pmix, pmi1 or none, not {v!r}")
        opts["mpi"] = v
    elif k == "output_filename":
        opts["output_filename"] = os.path.abspath(v)
    elif k == "stdin":
        if v == "none":
            opts["stdin"] = None
        elif v == "all":
            opts["stdin"] = "all"
        else:
            try:
                rank = int(v)
            except ValueError:
                raise ValueError(f"--stdin takes a rank number, 'all' or 'none', not {v!r}") \
                    from None
            if rank < 0:
                raise ValueError(f"--stdin takes a rank number, 'all' or 'none', not {v!r}")
            opts["stdin"] = rank
    elif k == "timeout":
        opts["timeout"] = _seconds(name, v)
    elif k == "app_file":
        if opts["app_file"] is not None:
            raise ValueError("give one --app or -configfile")
        opts["app_file"] = v
    elif k == "hostfile":
        from ..placement import read_hostfile

        if opts["hostfile"] is not None:
            raise ValueError(f"{name}: give the hosts once (--hostfile, -f or -hosts)")
        opts["hostfile"] = read_hostfile(v)
    elif k == "map_by":
        from ..placement import parse_map_by

        for key, value in parse_map_by(v).items():
            _placement(opts, key, value, name)
    elif k == "rank_by":
        from ..placement import parse_rank_by

        _placement(opts, "rank_by", parse_rank_by(v), name)
    elif k == "npernode":
        _placement(opts, "npernode", _count(name, v), name)
    elif k == "pernode":
        _placement(opts, "npernode", 1, name)
    elif k == "npersocket":
        _placement(opts, "map_by", "ppr", name)
        _placement(opts, "ppr", [_count(name, v), "socket"], name)
    elif k == "ppr":
        from ..placement import parse_map_by

        for key, value in parse_map_by(f"ppr:{v}").items():
            _placement(opts, key, value, name)
    elif k in ("bynode", "byslot", "bycore"):
        _placement(opts, "map_by", k[2:], name)
    elif k == "pe":
        _placement(opts, "pe", _count(name, v), name)
    elif k in ("oversubscribe", "nooversubscribe"):
        _placement(opts, "oversubscribe", k == "oversubscribe", name)
    elif k in ("display_map", "display_allocation", "report_bindings", "use_hwthread_cpus"):
        opts["placement"][k] = True
    elif k == "bind_to":
        from ..placement import parse_bind_to

        for key, value in parse_bind_to(v).items():
            _placement(opts, key, value, name)
    elif k in ("bind_to_core", "bind_to_socket"):
        _placement(opts, "bind_to", k[len("bind_to_"):], name)
    elif k == "cpu_set":
        from ..placement import parse_cpu_list

        _placement(opts, "cpu_set", parse_cpu_list(v), name)
    else:  # pragma: no cover - every declared key is handled above
        raise AssertionError(k)


def _split(argv: list[str]) -> list[list[str]]:
    segments: list[list[str]] = [[]]
    for tok in argv:
        if tok == ":":
            segments.append([])
        else:
            segments[-1].append(tok)
    return segments


def read_appfile(path: str, opt: str = "--app") -> list[list[str]]:
    """The app contexts of an ``--app`` (or ``-configfile``) file: one a
    line, each its options and command as a shell would split them; ``#``
    starts a comment and blank lines are skipped.  ValueError naming the
    file (and line) if it cannot be read."""
    import shlex

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{opt} {path}: cannot read it: {exc}") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ValueError(f"{opt} {path}:{lineno}: {exc}") from None
        if words:
            out.append((lineno, words))
    if not out:
        raise ValueError(f"{opt} {path}: no app context in it")
    return out


def new_opts() -> dict[str, Any]:
    """The options of a job before any is given (what :func:`parse_run` fills)."""
    return {
        "dvm": None, "session": None, "mca": [], "tag_output": False,
        "abort_on_failure": None, "pmix": False, "apps": [], "placement": {},
        "timeout": None, "stdin": 0, "timestamp_output": False, "merge_stderr": False,
        "output_filename": None, "quiet": False, "allow_run_as_root": False,
        "app_file": None, "hostfile": None, "warnings": [], "queue": None,
        "stop_in_init": False, "mpi": None, "genv": {}, "env_from": None,
        "app_file_opt": "--app"}


def new_app(argv: list[str], n: int | None = None) -> dict[str, Any]:
    """One app context, as :func:`parse_run` makes it: ``argv`` run ``n`` times."""
    app = _new_app()
    app["argv"], app["n"] = argv, n
    return app


#: The options of the whole job that a program gives as keyword arguments
#: (:meth:`pydvm.jobs.Dvm.submit`'s ``map_by="node"``, ``bind_to="core"``...):
#: keyword -> the key of the option in :data:`OPTIONS` it stands for, so that
#: both read a value the same way (``tests/test_cli_usage.py`` checks that
#: each is declared).  ``oversubscribe=False`` is ``--nooversubscribe``.
KEYWORDS: dict[str, str] = {
    "hostfile": "hostfile", "map_by": "map_by", "rank_by": "rank_by",
    "npernode": "npernode", "pernode": "pernode", "npersocket": "npersocket", "ppr": "ppr",
    "cpus_per_proc": "pe", "oversubscribe": "oversubscribe", "bind_to": "bind_to",
    "report_bindings": "report_bindings", "cpu_set": "cpu_set",
    "use_hwthread_cpus": "use_hwthread_cpus", "display_map": "display_map",
    "display_allocation": "display_allocation", "stop_in_init": "stop_in_init",
}

_BY_KEY: dict[str, Opt] = {o.key: o for o in OPTIONS}


def apply_keywords(opts: dict[str, Any], kw: dict[str, Any]) -> None:
    """Apply the job options given as keywords (:data:`KEYWORDS`) to
    ``opts`` (:func:`new_opts`), exactly as their command-line spelling
    would be: ``map_by="ppr:2:node"`` is ``--map-by ppr:2:node``.  A flag
    (``pernode``, ``report_bindings``...) is set by True and left out by
    False or None; a list of CPUs or hosts may be a list.  ValueError naming
    the option for a bad value, TypeError for an unknown keyword."""
    app = _new_app()
    for word, value in kw.items():
        key = KEYWORDS.get(word)
        if key is None:
            raise TypeError(f"unknown job option {word!r} (the job options are: "
                            f"{', '.join(sorted(KEYWORDS))})")
        if value is None:
            continue
        if key == "oversubscribe" and value is False:
            key, value = "nooversubscribe", True
        o = _BY_KEY[key]
        if o.nargs == 0:
            if not isinstance(value, bool):
                raise ValueError(f"{word} is True or False, not {value!r}")
            if not value:
                continue
            args: list[str] = []
        else:
            if isinstance(value, bool):
                raise ValueError(f"{word} needs a value, not {value!r}")
            if isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            args = [os.fspath(value) if key == "hostfile" else str(value)]
        _apply(o, o.names[0], args, opts, app)


def parse_run(argv: list[str]) -> dict[str, Any]:
    """Parse ``pydvm run`` arguments (MPMD contexts separated by ``:``).

    Returns the job's options: ``dvm``, ``session``, ``mca`` (pydvm's and
    Open MPI's parameters, told apart later), ``tag_output``,
    ``abort_on_failure``, ``pmix``, ``placement`` (:mod:`pydvm.placement`'s
    keys), ``timeout``, ``stdin`` (the rank that reads pydvm run's stdin, "all", or
    None), ``queue`` (True, False, None: the DVM's default), output options, ``warnings`` (to print before running) and
    ``apps``: each ``{"argv", "n", "hosts", "env", "cwd", "path"}``.
    ValueError naming what is wrong.
    """
    opts = new_opts()
    segments = _split(argv)
    for idx, seg in enumerate(segments):
        app = _new_app()
        where = "" if idx == 0 else f" in app context {idx}"
        cmd = _segment(seg, idx, opts, app, where, job_ok=idx == 0)
        if opts["app_file"] is not None:
            if cmd or len(segments) > 1 or app != _new_app():
                raise ValueError(f"{opts['app_file_opt']} FILE names the app contexts: give "
                                 "no command, ':' or app option (-n, --host, -x, -env, "
                                 "--wdir, --path) beside it")
            break
        if not cmd:
            raise ValueError(f"app context {idx} has no command")
        app["argv"] = cmd
        opts["apps"].append(app)
    if opts["app_file"] is not None:
        # mpiexec's -configfile lines may hold options of the whole job too
        job_ok = opts["app_file_opt"] != "--app"
        for n, (lineno, words) in enumerate(read_appfile(opts["app_file"],
                                                         opts["app_file_opt"])):
            app = _new_app()
            where = f" in {opts['app_file']}:{lineno}"
            cmd = _segment(words, n, opts, app, where, job_ok=job_ok)
            if not cmd:
                raise ValueError(f"{opts['app_file']}:{lineno}: no command")
            app["argv"] = cmd
            opts["apps"].append(app)
    if opts["timeout"] is None and os.environ.get("MPIEXEC_TIMEOUT"):
        opts["timeout"] = _seconds("MPIEXEC_TIMEOUT", os.environ["MPIEXEC_TIMEOUT"])
    return opts


# ----------------------------------------------------------------------
# help
# ----------------------------------------------------------------------


def _wrap(text: str, width: int, indent: int) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width - indent:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    return lines


def _option_lines(scope: str) -> list[str]:
    out = []
    for o in OPTIONS:
        if o.scope != scope and not (scope == JOB and o.scope == GLOBAL):
            continue
        if o.hydra and not o.mirrors:  # mpiexec's: as mpiexec users write them
            shown = [n for n in o.names if not n.startswith("--")]
        else:  # not mpirun's one-dash longs
            shown = [n for n in o.names if not (n.startswith("-") and not n.startswith("--")
                                                and len(n) > 2)]
        head = ", ".join(f"{n} {o.metavar}".rstrip() for n in shown)
        body = _wrap(o.help, 79, 22)
        if len(head) <= 19:
            out.append(f"  {head:<19} {body[0]}")
            rest = body[1:]
        else:
            out.append(f"  {head}")
            rest = body
        out += [" " * 22 + ln for ln in rest]
    return out


RUN_USAGE = """\
usage: pydvm run [--dvm URI] [--session ID] [--mca N V]... [--tag-output]
                 [--abort-on-failure | --no-abort-on-failure] [--pmix]
                 [--stop-in-init] [mpirun's options: see below]
                 [--host H[:SLOTS],...] [-n N] CMD ARGS...
                 [: [--host H[:SLOTS],...] [-n M] CMD2 ARGS...]..."""


def run_help() -> str:
    """``pydvm run --help``, made from :data:`OPTIONS`."""
    intro = """\
Run one job and exit with its status: the first non-zero exit of its
processes (128+N for a process killed by signal N), else 0.  Output is
forwarded live, line by line: each process's stdout is a terminal, as under
mpirun, its stderr a pipe.  pydvm run's own stdin goes to rank 0 (unless it
is /dev/null; --stdin says which rank, or all); the other ranks read
/dev/null.  Processes that fail are
reported on stderr, one line each (rank, node, exit status or signal), and
so is whoever ended the job ('pydvm kill', 'pydvm session end', 'pydvm
stop').  mpirun's command lines work as they are: docs/mpirun.md lists every
mpirun option and what pydvm does with it; one pydvm does not support is
refused with what to use instead.  So do MPICH's and Intel MPI's (mpiexec,
Hydra) where they do not clash with mpirun's: docs/mpiexec.md."""
    tail = """\
Job processes find PYDVM_NSPACE, PYDVM_RANK, PYDVM_APP_IDX, PYDVM_JOB_SIZE,
PYDVM_NODE and PYDVM_SERVER in their environment, and the OMPI_COMM_WORLD_*
variables mpirun sets.  Ctrl-C or SIGTERM kills the job and exits 128+N."""
    return "\n".join([RUN_USAGE, "", intro, "",
                      "options of the whole job (before the first command; mpiexec's",
                      "-hosts, -f, -ppn and -genv... in any context):",
                      *_option_lines(JOB), "",
                      "options of each app context (before its command; ':' starts the next):",
                      *_option_lines(APP),
                      "  --                  end of options: what follows is the command", "",
                      tail])


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
