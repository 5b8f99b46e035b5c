"""pydvm as PyTorch's distributed store and rendezvous.

PyTorch's distributed jobs meet through a key-value store (``TCPStore``,
``FileStore``, etcd...).  :class:`PydvmStore` is one kept in pydvm's data
store, with what that brings: keys scoped to the job that go when it ends
(even when ranks crash), per-user byte caps, removal only by the owning
user, lookups that wait without polling, atomic add and compare-and-set
served by the store itself.

* ``PydvmStore()`` inside a ``pydvm run`` job: the job's store (pass it to
  ``init_process_group(store=...)``);
* ``init_method="pydvm://"`` (registered by importing this package): the
  store, rank and world size from the job's environment
  (:mod:`pydvm.torch.rendezvous`);
* ``torchrun --rdzv-backend pydvm`` (found through the ``torchrun.handlers``
  entry point, or registered by importing this package): torch's elastic
  rendezvous with its state in pydvm (:mod:`pydvm.torch.elastic`).

PyTorch is an optional dependency: ``pip install 'pydvm[torch]'`` (see the
README for which build it installs).
"""

from __future__ import annotations

try:
    import torch.distributed as _dist
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "pydvm.torch needs PyTorch: pip install 'pydvm[torch]' "
        f"(or install torch yourself) -- {exc}") from None
if not _dist.is_available():  # pragma: no cover - a torch built without distributed
    raise ImportError("pydvm.torch needs a PyTorch build with torch.distributed")

import os
import threading

from .. import _torchrun
from ..enums import Range
from ._store import SCOPES, PydvmStore, shared_client
from .rendezvous import pydvm_rendezvous_handler, register as _register_scheme

__all__ = ["PydvmStore", "SCOPES", "pydvm_rendezvous_handler", "shared_client"]

_register_scheme()


def _register_elastic() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    # the very object the torchrun.handlers entry point registers: no conflict
    rendezvous_handler_registry.register("pydvm", _torchrun.create_handler)


_register_elastic()


def _connect_early() -> None:
    """Inside a job, open the process's connection (and its direct path to
    the master) in the background now: the first store operation -- in
    ``init_process_group``, say -- then finds it open.  Failing here costs
    nothing: the first use connects again, and raises."""
    def connect() -> None:
        try:
            shared_client().count("torch/", range=Range.NAMESPACE)
        except Exception:  # noqa: BLE001 - retried, and reported, on first use
            pass

    if all(os.environ.get(v) for v in ("PYDVM_SERVER", "PYDVM_NSPACE", "PYDVM_RANK")):
        threading.Thread(target=connect, name="pydvm-torch-connect", daemon=True).start()


_connect_early()
