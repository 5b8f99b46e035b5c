"""The job request model: what a job's options hold, each checked, and the ``run`` request.

A job's options are a dict (:func:`new_opts`, its app contexts
:func:`empty_app`) that the command line fills from ``pydvm run``'s argv
(:func:`pydvm.cli.runopts.parse_run`) and the job API from keyword
arguments (:func:`apply_keywords`, :func:`pydvm.client.jobspec.run_request`),
each option's value read and checked the same way (:func:`apply_option`,
ValueError naming the option as it was written).  :func:`build_request`
makes the ``run`` request a master takes of them; :func:`run_request` is
its bare form.  The options themselves are declared in
:mod:`pydvm.client.options`.

On the fast path of every ``pydvm run``: it imports the protocol's
host-list reader and the option table; the placement parsers
(:mod:`pydvm.placement`) are loaded only by the options that need them.
"""

from __future__ import annotations

import os

from ..protocol import parse_host_list
from .options import KEYWORDS, OPTIONS, Opt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# ----------------------------------------------------------------------
# the options of a job
# ----------------------------------------------------------------------


def new_opts() -> dict[str, Any]:
    """The options of a job before any is given (what
    :func:`pydvm.cli.runopts.parse_run` and :func:`apply_keywords` fill)."""
    return {
        "dvm": None, "session": None, "mca": [], "tag_output": False,
        "abort_on_failure": None, "pmix": False, "apps": [], "placement": {},
        "timeout": None, "stdin": 0, "timestamp_output": False, "merge_stderr": False,
        "output_filename": None, "quiet": False, "allow_run_as_root": False,
        "app_file": None, "hostfile": None, "warnings": [], "queue": None,
        "stop_in_init": False, "mpi": None, "genv": {}, "env_from": None,
        "app_file_opt": "--app"}


def new_app(argv: list[str], n: int | None = None) -> dict[str, Any]:
    """One app context, as :func:`pydvm.cli.runopts.parse_run` makes it:
    ``argv`` run ``n`` times."""
    app = empty_app()
    app["argv"], app["n"] = argv, n
    return app


def empty_app() -> dict[str, Any]:
    """One app context before any of its options is given (its ``argv`` is the caller's)."""
    return {"n": None, "hosts": None, "env": {}, "cwd": None, "path": None, "env_from": None}


# ----------------------------------------------------------------------
# each option's value, checked and applied
# ----------------------------------------------------------------------


def _count(opt: str, text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"{opt} needs a number, not {text!r}") from None
    if v < 1:
        raise ValueError(f"{opt} must be at least 1")
    return v


def parse_seconds(opt: str, text: str) -> float:
    """``text``, the value of ``opt``, as a number of seconds > 0 (ValueError if not)."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{opt} needs a number of seconds, not {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{opt} must be a number of seconds > 0, not {text}")
    return v


def _env_names(opt: str, text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any("=" in n for n in names):
        raise ValueError(f"{opt} needs a list of variable names (A,B,..), not {text!r}")
    return names



def _placement(opts: dict, key: str, value: Any, name: str) -> None:
    place = opts["placement"]
    if key in place and place[key] != value:
        raise ValueError(f"{name} contradicts an earlier placement option")
    place[key] = value


def apply_option(o: Opt, name: str, args: list[str], opts: dict, app: dict) -> None:
    """What option ``o`` (written ``name``) with ``args`` does to ``opts``
    (the job's, :func:`new_opts`) and ``app`` (the context it is given in,
    :func:`empty_app`).  ValueError naming ``name`` for a bad value."""
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
        opts["timeout"] = parse_seconds(name, v)
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

_BY_KEY: dict[str, Opt] = {o.key: o for o in OPTIONS}


def apply_keywords(opts: dict[str, Any], kw: dict[str, Any]) -> None:
    """Apply the job options given as keywords (:data:`KEYWORDS`) to
    ``opts`` (:func:`new_opts`), exactly as their command-line spelling
    would be: ``map_by="ppr:2:node"`` is ``--map-by ppr:2:node``.  A flag
    (``pernode``, ``report_bindings``...) is set by True and left out by
    False or None; a list of CPUs or hosts may be a list.  ValueError naming
    the option for a bad value, TypeError for an unknown keyword."""
    app = empty_app()
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
        apply_option(o, o.names[0], args, opts, app)


# ----------------------------------------------------------------------
# the run request
# ----------------------------------------------------------------------


def is_pydvm_param(name: str) -> bool:
    """Whether ``--mca NAME`` sets pydvm (its parameters are all named
    ``prte_*``, ``pydvm_*`` or ``plm_*`` -- the launcher, which no job process
    reads) or is Open MPI's, for the job's processes."""
    return name.startswith(("prte_", "pydvm_", "plm_"))


def build_request(opts: dict[str, Any], environ: dict[str, str] | None = None,
                  cwd: str | None = None) -> dict[str, Any]:
    """The ``run`` request of a job's options ``opts`` (:func:`new_opts`, as
    ``pydvm run``'s command line fills them, :func:`pydvm.cli.runopts.parse_run`,
    or the job API's arguments, :func:`pydvm.client.jobspec.run_request`).  The
    job's environment is ``environ`` (default: ours) with Open MPI's
    ``--mca`` parameters added; its working directory ``cwd`` (default: ours)."""
    environ_ = dict(os.environ) if environ is None else environ
    given: dict[str, str] = {}  # what every process gets, whatever environment it starts from
    for name, value in opts["mca"]:
        if not is_pydvm_param(name):
            given[f"OMPI_MCA_{name}"] = value  # Open MPI's: to every process, as mpirun does
    given.update(opts.get("genv") or {})  # mpiexec's -genv
    env = {**environ_, **given}
    apps = []
    for a in opts["apps"]:
        app_env = dict(a["env"])
        env_from = a.get("env_from") or opts.get("env_from")
        if env_from not in (None, "all"):
            # mpiexec's -genvnone/-genvlist: the processes start from their
            # node's environment, plus the variables listed, -genv's and their own
            listed = env_from if isinstance(env_from, list) else []
            app_env = {**{k: environ_[k] for k in listed if k in environ_}, **given,
                       **app_env}
        if a["path"]:
            app_env["PATH"] = a["path"] + os.pathsep + app_env.get("PATH", env.get("PATH", ""))
        hosts = a["hosts"] if a["hosts"] is not None else opts["hostfile"]
        app: dict[str, Any] = {"argv": a["argv"], "n": a["n"], "hosts": hosts}
        if app_env:
            app["env"] = app_env
        if a["cwd"]:
            app["cwd"] = a["cwd"]
        if env_from not in (None, "all"):
            app["env"], app["env_from"] = app_env, "node"
        apps.append(app)
    placement = dict(opts["placement"])
    derived = "npernode" in placement or "ppr" in placement or "ppn" in placement
    for a, app in zip(opts["apps"], apps):
        # Without -n a job runs one process -- unless -N, --ppr or a hostfile
        # (for an app without --host) says how many, as mpirun derives it.
        if app["n"] is None and not (derived or (a["hosts"] is None and opts["hostfile"])):
            app["n"] = 1
    req = run_request(apps, opts["session"], opts["abort_on_failure"], opts["pmix"],
                      stdin=False, env=env, cwd=cwd)
    if placement:
        req["placement"] = placement
    if opts["timeout"] is not None:
        req["timeout"] = opts["timeout"]
    if opts["stdin"]:
        req["stdin_rank"] = opts["stdin"]
    if opts.get("queue") is not None:
        req["queue"] = opts["queue"]
    if opts.get("stop_in_init"):
        req["stop_in_init"] = True
    if opts.get("mpi"):
        if opts["pmix"] and opts["mpi"] != "pmix":
            raise ValueError(f"--pmix asks for PMIx, --mpi {opts['mpi']} for another "
                             "interface: give one of them")
        req["mpi"] = opts["mpi"]
    return req


def run_request(apps: list[dict], session: int | None, abort_on_failure: bool | None,
                pmix: bool, stdin: bool, env: dict[str, str] | None = None,
                cwd: str | None = None) -> dict:
    """The ``run`` request of a job (its id is the caller's)."""
    return {"t": "run", "apps": apps, "session": session, "abort_on_failure": abort_on_failure,
            "env": dict(os.environ if env is None else env), "cwd": cwd or os.getcwd(),
            "pmix": pmix, "stdin": stdin}
