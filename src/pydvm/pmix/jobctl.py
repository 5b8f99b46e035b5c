"""The ``job_control`` and ``allocate`` upcalls: the binding's side.

libpmix 4.2.2 hands both on with the requester it authenticated at connect
(unlike a query's), so the host knows exactly who asks.  Each becomes a
request (:class:`~pydvm.pmix.requests.JobControl`,
:class:`~pydvm.pmix.requests.Allocate`) delivered to the host's handler
like any other upcall, answered through an :class:`~pydvm.pmix.replies.InfoReply`
-- whose garbage-collected, unanswered end still answers ``PMIX_ERROR``, so
libpmix is never left waiting.  A job-control directive the binding cannot
copy is not dropped silently: its key is listed in ``unreadable`` and the
host decides (pydvm refuses it ``PMIX_ERR_BAD_PARAM`` if it was an action).

:func:`action_of` is the pure part of the host's decision, kept here where
the attribute names are: what a set of directives asks for.
"""

from __future__ import annotations

from typing import Callable

from . import _lib as L
from . import constants as C
from .directives import CLAIMS
from .replies import InfoReply
from .requests import Allocate, JobControl
from .values import PmixValueError, Value, info_at, proc_at, procs_at

# Job-control attributes (pmix_common.h, OpenPMIx 4.2)
JOB_CTRL_ID = "pmix.jctrl.id"
JOB_CTRL_PAUSE = "pmix.jctrl.pause"
JOB_CTRL_RESUME = "pmix.jctrl.resume"
JOB_CTRL_CANCEL = "pmix.jctrl.cancel"
JOB_CTRL_KILL = "pmix.jctrl.kill"
JOB_CTRL_RESTART = "pmix.jctrl.restart"
JOB_CTRL_CHECKPOINT = "pmix.jctrl.ckpt"
JOB_CTRL_CHECKPOINT_EVENT = "pmix.jctrl.ckptev"
JOB_CTRL_CHECKPOINT_SIGNAL = "pmix.jctrl.ckptsig"   # also _CHECKPOINT_TIMEOUT's key in 4.2
JOB_CTRL_CHECKPOINT_METHOD = "pmix.jctrl.ckmethod"
JOB_CTRL_SIGNAL = "pmix.jctrl.sig"
JOB_CTRL_PROVISION = "pmix.jctrl.pvn"
JOB_CTRL_PROVISION_IMAGE = "pmix.jctrl.pvnimg"
JOB_CTRL_PREEMPTIBLE = "pmix.jctrl.preempt"
JOB_CTRL_TERMINATE = "pmix.jctrl.term"

#: pmix_alloc_directive_t
ALLOC_NEW, ALLOC_EXTEND, ALLOC_RELEASE, ALLOC_REAQUIRE, ALLOC_EXTERNAL = 1, 2, 3, 4, 128
ALLOC_DIRECTIVES = {ALLOC_NEW: "new", ALLOC_EXTEND: "extend", ALLOC_RELEASE: "release",
                    ALLOC_REAQUIRE: "reacquire", ALLOC_EXTERNAL: "external"}

#: Directives that ask for an action a host may carry out.
ACTIONS = (JOB_CTRL_KILL, JOB_CTRL_TERMINATE, JOB_CTRL_SIGNAL, JOB_CTRL_PAUSE, JOB_CTRL_RESUME)
#: Directives that ask for what a fixed DVM cannot do (no checkpointing,
#: no provisioning, no request queue to cancel from).
UNSUPPORTED = (JOB_CTRL_CANCEL, JOB_CTRL_RESTART, JOB_CTRL_CHECKPOINT, JOB_CTRL_PROVISION,
               JOB_CTRL_PROVISION_IMAGE)
#: Statements about the job that need no action from a host that never
#: preempts nor checkpoints (OpenPMIx's jctrl.c example declares them).
NOTES = (JOB_CTRL_ID, JOB_CTRL_PREEMPTIBLE, JOB_CTRL_CHECKPOINT_METHOD,
         JOB_CTRL_CHECKPOINT_EVENT, JOB_CTRL_CHECKPOINT_SIGNAL)
#: The highest signal number a SIGNAL directive may carry (Linux's SIGRTMAX).
MAX_SIGNAL = 64
SIGCONT, SIGSTOP = 18, 19


class Refused(Exception):
    """What a job-control request asks cannot be done: ``status`` says why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def action_of(directives: dict[str, Value], unreadable=()) -> tuple[str, int] | None:
    """What ``directives`` ask for: ``("kill", 0)`` (forcibly),
    ``("terminate", 0)`` (politely), ``("signal", N)`` -- PAUSE and RESUME
    are SIGSTOP and SIGCONT -- or None when they only state facts (an id,
    preemptible, a checkpoint method).  Raises :class:`Refused`:
    ``PMIX_ERR_BAD_PARAM`` for a malformed or unreadable action, or two
    actions in one request; ``PMIX_ERR_NOT_SUPPORTED`` for checkpoint,
    restart, provision, cancel or an unknown ``pmix.jctrl.*`` directive."""
    for key in unreadable:
        if key in ACTIONS:
            raise Refused(C.ERR_BAD_PARAM, f"{key}: its value cannot be read")
    found: list[tuple[str, int]] = []
    for key, v in directives.items():
        if key in UNSUPPORTED:
            raise Refused(C.ERR_NOT_SUPPORTED, f"{key} is not supported by this DVM")
        if key in (JOB_CTRL_KILL, JOB_CTRL_TERMINATE, JOB_CTRL_PAUSE, JOB_CTRL_RESUME):
            if not isinstance(v.value, bool):
                raise Refused(C.ERR_BAD_PARAM, f"{key} needs a bool, not {C.type_name(v.type)}")
            if v.value:
                found.append({JOB_CTRL_KILL: ("kill", 0), JOB_CTRL_TERMINATE: ("terminate", 0),
                              JOB_CTRL_PAUSE: ("signal", SIGSTOP),
                              JOB_CTRL_RESUME: ("signal", SIGCONT)}[key])
        elif key == JOB_CTRL_SIGNAL:
            sig = v.value
            if isinstance(sig, bool) or not isinstance(sig, int) or not 0 < sig <= MAX_SIGNAL:
                raise Refused(C.ERR_BAD_PARAM, f"{key}: {sig!r} is not a signal number")
            found.append(("signal", int(sig)))
        elif key.startswith("pmix.jctrl.") and key not in NOTES:
            raise Refused(C.ERR_NOT_SUPPORTED, f"{key} is not supported by this DVM")
    if len(found) > 1:
        raise Refused(C.ERR_BAD_PARAM, "one action per job-control request")
    return found[0] if found else None


def upcalls(server) -> dict[str, Callable]:
    """The two upcalls of ``server`` (a :class:`~pydvm.pmix.PmixServer`), by
    their ``pmix_server_module_t`` names, for its module table."""

    def job_control(requestor, targets, ntargets, dirs, ndirs, cbfunc, cbdata):
        copied: dict[str, Value] = {}
        unreadable: list[str] = []
        for key, val in info_at(dirs, ndirs, CLAIMS):
            if isinstance(val, PmixValueError):
                unreadable.append(key)
            else:
                copied[key] = val
        req = JobControl(proc_at(requestor), procs_at(targets, ntargets), copied, unreadable)
        req.reply = InfoReply(server, cbfunc, cbdata, L.info_cbfunc_t, req.kind)
        return server._post(req)

    def allocate(client, directive, data, ndata, cbfunc, cbdata):
        info = {k: v for k, v in info_at(data, ndata, CLAIMS)
                if not isinstance(v, PmixValueError)}
        req = Allocate(proc_at(client), int(directive), info)
        req.reply = InfoReply(server, cbfunc, cbdata, L.info_cbfunc_t, req.kind)
        return server._post(req)

    return {"job_control": job_control, "allocate": allocate}
