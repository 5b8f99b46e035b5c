"""Every option a job's ``run`` request may carry, declared once.

An :class:`Opt` says an option's spellings, how many arguments it takes,
whether it belongs to the whole job or to the app context it is written in,
its help text, and which ``mpirun`` option it mirrors (Open MPI 4.1's
spelling, or ``""`` for pydvm's own) and which of MPICH's ``mpiexec``
(Hydra).  What a job may ask is this table: ``pydvm run`` reads its
command line against it (:mod:`pydvm.cli.runopts`, which also makes
``pydvm run --help`` of it), the job API's keyword arguments stand for its
options (:data:`KEYWORDS`), and both go through one model
(:mod:`pydvm.client.request`: each option's value checked and applied,
the request built).  The "coming from mpirun" and "coming from mpiexec"
pages (``docs/mpirun.md``, ``docs/mpiexec.md``) and the parity tests are
checked against it (``tests/test_cli_usage.py``).

Declarations only: it imports nothing, and is on the fast path of every
``pydvm run``.
"""

from __future__ import annotations

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
