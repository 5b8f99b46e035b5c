"""What a ``PMIx_Spawn`` asks of a debugger, read on the node.

A tool's spawn reaches a node's PMIx server as job-level info (key ->
:class:`pydvm.pmix.Value`); the node turns the debugger keys into plain
fields of its ``spawn`` request to the master, which places the job and any
debugger daemons (:mod:`pydvm.runtime.master.debugging`).  Pure: no state,
no I/O.
"""

from __future__ import annotations

from ...pmix import constants as PC


def spawn_directives(job_info: dict) -> dict:
    """What a ``PMIx_Spawn``'s job-level info asks of a debugger, as wire
    fields of the node's ``spawn`` message: ``stop_in_init`` (True),
    ``debug_target`` ([nspace, rank]), ``daemons_per_node`` /
    ``daemons_per_proc`` (counts), ``refused`` ([status, why]) for what
    pydvm cannot do.  ``job_info``: key -> :class:`pydvm.pmix.Value`."""
    out: dict = {}
    v = job_info.get(PC.DEBUG_STOP_IN_INIT)
    if v is not None:
        if v.type == PC.BOOL:
            if v.value:
                out["stop_in_init"] = True
        elif v.type == PC.PROC_RANK and int(v.value) == PC.RANK_WILDCARD:
            out["stop_in_init"] = True
        else:
            # libpmix 4.2.2's client stops whenever the key is there, whatever
            # rank it names (pmix_client.c): every rank or none
            out["refused"] = [PC.ERR_NOT_SUPPORTED, "PMIX_DEBUG_STOP_IN_INIT stops every "
                              "rank or none here (true, or rank WILDCARD)"]
    if PC.DEBUG_STOP_ON_EXEC in job_info:
        out["refused"] = [PC.ERR_NOT_SUPPORTED, "PMIX_DEBUG_STOP_ON_EXEC is not supported: "
                          "use PMIX_DEBUG_STOP_IN_INIT"]
    t = job_info.get(PC.DEBUG_TARGET)
    j = job_info.get(PC.DEBUG_JOB)
    if t is None and j is not None:
        # the deprecated name OpenPMIx 4.2's examples/debugger.c still sends:
        # a namespace, the whole job
        if j.type != PC.STRING or not j.value:
            out["refused"] = [PC.ERR_BAD_PARAM, "PMIX_DEBUG_JOB must be a namespace"]
        else:
            out["debug_target"] = [j.value, PC.RANK_WILDCARD]
    if t is not None:
        if t.type != PC.PROC:
            out["refused"] = [PC.ERR_BAD_PARAM, "PMIX_DEBUG_TARGET must be a pmix_proc_t"]
        else:
            out["debug_target"] = [t.value.nspace, int(t.value.rank)]
    for key, field_ in ((PC.DEBUG_DAEMONS_PER_NODE, "daemons_per_node"),
                        (PC.DEBUG_DAEMONS_PER_PROC, "daemons_per_proc")):
        c = job_info.get(key)
        if c is None:
            continue
        try:
            n = int(c.value)
        except (TypeError, ValueError):
            n = 0
        if isinstance(c.value, bool) or not 1 <= n <= 1024:
            out["refused"] = [PC.ERR_BAD_PARAM, f"{key} must be a count from 1 to 1024"]
        else:
            out[field_] = n
    if ("daemons_per_node" in out or "daemons_per_proc" in out) and "debug_target" not in out:
        out["refused"] = [PC.ERR_BAD_PARAM, "debugger daemons need PMIX_DEBUG_TARGET"]
    return out
