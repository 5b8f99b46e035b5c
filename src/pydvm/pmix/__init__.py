"""PMIx server binding: host a real libpmix server inside a pydvm daemon.

Importing this package never loads libpmix; :func:`available` tells whether
it can be used.  See docs/pmix.md for the boundary an integrator uses.
"""
from ._lib import PmixUnavailable, available, check_version
from . import constants
from .values import DataArray, PmixValueError, Proc, Value
from .requests import (Abort, App, ClientConnected, ClientFinalized, Connect, DirectModex,
                       Disconnect, Fence, Lookup, Publish, Request, Spawn, Unpublish)
from .replies import LookupReply, ModexReply, OpReply, SpawnReply
from .server import Handler, PmixServerError, PmixServer, cleanup_stale

__all__ = [
    "Abort", "App", "ClientConnected", "ClientFinalized", "Connect", "DataArray",
    "DirectModex", "Disconnect", "Fence", "Handler", "Lookup", "LookupReply", "ModexReply",
    "OpReply", "PmixServerError", "PmixServer", "PmixUnavailable", "PmixValueError", "Proc",
    "Publish", "Request", "Spawn", "SpawnReply", "Unpublish", "Value", "available",
    "check_version", "cleanup_stale", "constants",
]
