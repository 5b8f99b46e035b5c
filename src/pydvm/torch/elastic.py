"""The ``pydvm`` rendezvous backend of torch's elastic agent (``torchrun``).

::

    pydvm run --host a:1,b:1 -n 2 \\
        torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend pydvm --rdzv-id run1 train.py

Each ``torchrun`` agent is a process of the pydvm job.  They meet through
torch's own elastic rendezvous algorithm (``DynamicRendezvousHandler``:
joining, last call, keep-alives, closing, restarts), whose shared state is
held in pydvm's store by :class:`PydvmRendezvousBackend` -- one key,
changed only by compare-and-set.  The agents' store is a
:class:`~pydvm.torch.PydvmStore` too: its keys, the rendezvous state
included, go when the job ends.

The workers' store.  torch's handler normally starts a TCPStore server in
the rank-0 agent and has the workers connect to it (or, with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, has the rank-0 worker start
one).  This handler starts no TCPStore: it takes the second way (so
``MASTER_ADDR``/``MASTER_PORT`` still name a free port on the rank-0
agent's host, for workers that use ``env://``), says
``use_agent_store`` False, and puts ``PYDVM_TORCH_ROUND`` in the agent's
environment before it starts its workers: a worker that calls
``init_process_group(init_method="pydvm://")`` then uses a PydvmStore of
its rendezvous round -- its keys apart from every other round's, gone with
the job.

Options (``--rdzv-conf``): ``scope`` (``job``, default: every agent is a
process of one pydvm job; ``session``: agents in several jobs of a session
-- e.g. nodes joining later with their own ``pydvm run``; ``dvm``),
``read_timeout`` (seconds, default 60), and torch's own ``join_timeout``,
``last_call_timeout``, ``close_timeout``, ``heartbeat_timeout``,
``keep_alive_interval``, ``keep_alive_max_attempt``.  ``--rdzv-endpoint``
is not used (the DVM is found from the job's environment).
"""

from __future__ import annotations

import os
from datetime import timedelta

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousInfo
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousTimeout,
    Token,
)

from ._store import SCOPES, PydvmStore
from .rendezvous import ROUND_ENV

#: torch's switch between sharing the agent's TCPStore and not.
SHARE_SWITCH = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class PydvmRendezvousBackend(RendezvousBackend):
    """Holds an elastic rendezvous's state under one key of a PydvmStore.

    The fencing token is the state as read: ``set_state`` stores only over
    the state its caller last saw (or over none, for a token of None), by
    pydvm's compare-and-set, which also says whether it stored.
    """

    def __init__(self, store: PydvmStore, run_id: str) -> None:
        if not run_id:
            raise ValueError("the run id must be a non-empty string")
        self._store = store
        self._key = "state"

    @property
    def name(self) -> str:
        """``pydvm``: the backend's name, as torchrun reports it."""
        return "pydvm"

    def get_state(self) -> tuple[bytes, Token] | None:
        """The rendezvous state and its fencing token, or None if there is
        none yet (a lookup that does not wait)."""
        state = self._store._peek(self._key)
        return None if state is None else (state, state)

    def set_state(self, state: bytes, token: Token | None = None
                  ) -> tuple[bytes, Token, bool] | None:
        """Store ``state`` over the one ``token`` was read with (None: over
        no state); returns the state now held, its token, and whether it
        is ours -- one compare-and-set."""
        if token is not None and not isinstance(token, bytes):
            current = self.get_state()  # not one of ours: cannot match
            return None if current is None else (*current, False)
        value, stored = self._store._swap(self._key, token, state)
        if value is None:
            return None
        return value, value, stored


class PydvmRendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic rendezvous over :class:`PydvmRendezvousBackend`,
    with the workers' store left to pydvm (see the module docstring)."""

    #: (scope, name) of the agents' store, for the workers' round stores.
    _pydvm_store: tuple[str, str] = ("job", "")

    @property
    def use_agent_store(self) -> bool:
        """False: workers are not sent to a TCPStore of this agent (it runs none)."""
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        """torch's next round, without a TCPStore server; the round's worker
        store is named in ``PYDVM_TORCH_ROUND`` for the workers this agent
        starts next."""
        saved = os.environ.get(SHARE_SWITCH)
        os.environ[SHARE_SWITCH] = "1"  # no TCPStore server in this agent
        try:
            info = super().next_rendezvous()
        finally:
            if saved is None:
                os.environ.pop(SHARE_SWITCH, None)
            else:
                os.environ[SHARE_SWITCH] = saved
        scope, name = self._pydvm_store
        os.environ[ROUND_ENV] = f"{scope} {name}/round-{self._state_holder.state.round}"
        return info


def _timeout(params: RendezvousParameters, key: str) -> timedelta | None:
    seconds = params.get_as_int(f"{key}_timeout")
    return None if seconds is None else timedelta(seconds=seconds)


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The ``pydvm`` backend's handler for torch's rendezvous ``params``."""
    scope = params.get("scope", "job")
    if scope not in SCOPES:
        raise ValueError(f"rdzv-conf scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    read_timeout = params.get_as_int("read_timeout", 60)
    if read_timeout is None or read_timeout <= 0:
        raise ValueError("the read timeout must be a positive integer")
    name = f"elastic/{params.run_id}"
    store = PydvmStore(name, scope=scope, timeout=timedelta(seconds=read_timeout))
    backend = PydvmRendezvousBackend(store, params.run_id)
    timeout = RendezvousTimeout(_timeout(params, "join"), _timeout(params, "last_call"),
                                _timeout(params, "close"), _timeout(params, "heartbeat"))
    handler = PydvmRendezvousHandler.from_backend(
        params.run_id, store, backend, params.min_nodes, params.max_nodes, params.local_addr,
        timeout, keep_alive_interval=params.get_as_int("keep_alive_interval", 5),
        keep_alive_max_attempt=params.get_as_int("keep_alive_max_attempt", 3))
    handler._pydvm_store = (scope, name)
    return handler
