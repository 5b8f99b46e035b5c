"""The client side of pydvm: what a program uses to talk to a DVM.

One door for everything a job process or a workflow program imports:

* :class:`Client` (``data.py``) -- the blocking data-store client of a job
  process (``publish``, ``lookup``, ``unpublish``...); the asyncio twin is
  :class:`pydvm.aio.Client` (``aio.py``);
* ``proto.py`` -- request building and reply reading both clients share;
* ``mux.py`` -- several threads' requests on one blocking connection, a
  :class:`pydvm.channel.BlockingChannel` (``channel.py`` names it here too);
* ``direct.py`` -- the direct data path to the master store;
* ``connect.py`` -- reaching a DVM's master as a tool: the URI, the socket,
  the handshake, and what fails there (:class:`~pydvm.client.connect.DvmError`);
  ``pydvm run`` connects through it too;
* ``options.py`` and ``request.py`` -- the job request model: every option
  a job's ``run`` request may carry, each checked, and the request built
  (``pydvm run`` parses its argv into it);
* ``jobs.py`` -- jobs from Python (:class:`Dvm`, :class:`Job`: one tool
  connection to a DVM's master carrying many jobs), ``jobspec.py`` what it
  sends and returns, ``jobconn.py`` its connection and starting a DVM,
  ``executor.py`` the :class:`Executor`, ``aiojobs.py`` the asyncio twin
  (``pydvm.jobs`` and ``pydvm.aio.jobs`` are their public names).

Nothing here loads the runtime or imports the command line
(``tests/test_layers.py`` checks both), and nothing is imported before it
is asked for: ``pydvm run`` takes the connecting and the request model
alone.
"""

from __future__ import annotations

#: Public names and the module each lives in (loaded on first use).
_LAZY = {
    "Client": "data",
    "Found": "proto",
    "LookupResult": "proto",
    "Dvm": "jobs",
    "Job": "jobs",
    "JobResult": "jobspec",
    "JobSpec": "jobspec",
    "Executor": "executor",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pydvm.client' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
