"""``init_method="pydvm://"``: torch's rendezvous from a pydvm job's environment.

``import pydvm.torch`` registers the ``pydvm`` URL scheme with
``torch.distributed.register_rendezvous_handler``; then, in every process
of a ``pydvm run`` job::

    dist.init_process_group("gloo", init_method="pydvm://")

yields a :class:`~pydvm.torch.PydvmStore` with the process's rank and the
world size:

* rank and world size: ``rank=``/``world_size=`` given to
  ``init_process_group`` (torch puts them in the URL's query), else
  torchrun's ``RANK``/``WORLD_SIZE`` (a worker of ``torchrun``), else the
  job's ``PYDVM_RANK``/``PYDVM_JOB_SIZE``;
* the store: job-scoped unless the URL says ``?scope=session`` or
  ``?scope=dvm``; ``?name=N`` picks a store of its own.  Each rendezvous a
  process makes gets fresh keys (``pg0/``, ``pg1/``... in the order the
  process makes them, the same on every rank of an SPMD program), so a
  second ``init_process_group`` after ``destroy_process_group`` never
  reads the first one's keys.  A torchrun worker whose agent rendezvoused
  through pydvm (``--rdzv-backend=pydvm``) uses the store of its
  rendezvous round (:mod:`pydvm.torch.elastic`).
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from ._store import SCOPES, PydvmStore

#: Set by pydvm's elastic handler in the agent, inherited by its workers:
#: ``SCOPE NAME`` of the store of the current rendezvous round.
ROUND_ENV = "PYDVM_TORCH_ROUND"

_generation = itertools.count()


def _int_param(query: dict, name: str) -> int | None:
    values = query.get(name)
    if not values:
        return None
    try:
        v = int(values[-1])
    except ValueError:
        raise ValueError(f"pydvm:// rendezvous: {name}={values[-1]!r} is not an integer") from None
    return None if v < 0 else v


def _env_int(*names: str) -> int | None:
    for name in names:
        text = os.environ.get(name)
        if text:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"pydvm:// rendezvous: {name}={text!r} is not an "
                                 "integer") from None
    return None


def pydvm_rendezvous_handler(url: str, timeout: timedelta | None = None, **kwargs):
    """torch's rendezvous handler for ``pydvm://`` URLs (see the module docstring).

    A generator yielding ``(store, rank, world_size)`` once; asked again
    (torch never does for this kind of URL) it raises, as ``env://`` does.
    """
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    rank = _int_param(query, "rank")
    world = _int_param(query, "world_size")
    elastic = "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ
    if rank is None:
        rank = _env_int("RANK", "PYDVM_RANK") if elastic else _env_int("PYDVM_RANK")
    if world is None:
        world = _env_int("WORLD_SIZE", "PYDVM_JOB_SIZE") if elastic else \
            _env_int("PYDVM_JOB_SIZE")
    if rank is None or world is None:
        raise ValueError("pydvm:// rendezvous: no rank or world size -- run inside a "
                         "'pydvm run' job, or pass rank= and world_size=")
    scope = (query.get("scope") or [""])[-1]
    name = (query.get("name") or [""])[-1]
    round_env = os.environ.get(ROUND_ENV, "") if elastic else ""
    if round_env and not scope and not name:
        scope, _, name = round_env.partition(" ")
        name += "/workers"
    elif elastic and not name:
        # a worker of another rendezvous backend: its run and restart
        name = (f"elastic/{os.environ['TORCHELASTIC_RUN_ID']}/"
                f"restart-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    scope = scope or "job"
    if scope not in SCOPES:
        raise ValueError(f"pydvm:// rendezvous: scope must be one of {', '.join(SCOPES)}, "
                         f"not {scope!r}")
    name = f"{name}/pg{next(_generation)}" if name else f"pg{next(_generation)}"
    store = PydvmStore(name, scope=scope, timeout=timeout)
    yield (store, rank, world)
    raise RuntimeError("pydvm:// rendezvous cannot be repeated; call init_process_group again")


def register() -> None:
    """Register the ``pydvm://`` scheme (done by ``import pydvm.torch``; once)."""
    try:
        dist.register_rendezvous_handler("pydvm", pydvm_rendezvous_handler)
    except RuntimeError:
        pass  # registered already (this module imported twice under two names)
