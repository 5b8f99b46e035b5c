"""pydvm: a distributed virtual machine with a PMIx-style data store.

``from pydvm import Client`` gives the blocking client a job process uses;
``pydvm.aio.Client`` is the asyncio one.  Ranges, persistences and statuses
are :class:`Range`, :class:`Persistence` and :class:`Status`.
"""

from ._proto import Found, LookupResult
from .client import Client
from .enums import Persistence, Range
from .errors import PMIxError, Status
from .protocol import Typed

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Found",
    "LookupResult",
    "Persistence",
    "PMIxError",
    "Range",
    "Status",
    "Typed",
    "__version__",
]
