"""Status codes and the exceptions that carry them.

Every request to a pydvm store ends in exactly one status.  The numbers are
the PMIx ones (SPEC section 8) so that the wire and the logs read like PMIx.

The client libraries turn a non-success status into one exception class per
status, all derived from :class:`PMIxError`.  A partial lookup is not an
error: it comes back as a result whose ``status`` is
``Status.ERR_PARTIAL_SUCCESS`` (see :class:`pydvm.LookupResult`).
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """PMIx status codes used by pydvm (SPEC section 8)."""

    SUCCESS = 0
    """The request did what it asked (for a lookup: every key was found)."""
    ERR_NO_PERMISSIONS = -23
    """Refused: the keys exist but this caller may not read them, or a
    connection or claim names a process or user it may not act as."""
    ERR_TIMEOUT = -24
    """A waiting lookup was not satisfied within its timeout."""
    ERR_UNREACH = -25
    """The daemon, the master or the data server could not be reached."""
    ERR_BAD_PARAM = -27
    """The request was malformed; the message names the problem."""
    ERR_OUT_OF_RESOURCE = -29
    """An item larger than the whole per-uid cap, or too many requests
    outstanding on one connection."""
    ERR_NOT_FOUND = -46
    """No requested key is there (never published, or already removed)."""
    ERR_PARTIAL_SUCCESS = -52
    """A lookup found some of its keys, not all; not an error for the clients."""
    ERR_DUPLICATE_KEY = -53
    """A published key collides with a stored one (another owner's, or the
    caller's own without ``replace``)."""

    @property
    def pmix_name(self) -> str:
        """The PMIx spelling, e.g. ``PMIX_ERR_NOT_FOUND``."""
        return "PMIX_" + self.name

    @classmethod
    def coerce(cls, value: int) -> "Status":
        """Map a wire integer to a Status; unknown numbers raise ValueError."""
        return cls(int(value))


class PMIxError(Exception):
    """A request ended with a non-success status.

    Raised by :class:`pydvm.Client` and :class:`pydvm.aio.Client`.  ``status``
    is the :class:`Status`; ``message`` is the server's explanation (may be
    empty).  Catch the subclass for the case you handle, or this class for
    all of them.
    """

    status: Status = Status.ERR_BAD_PARAM

    def __init__(self, message: str = "", status: Status | None = None) -> None:
        if status is not None:
            self.status = status
        self.message = message
        text = self.status.pmix_name + (f": {message}" if message else "")
        super().__init__(text)


class NoPermissionsError(PMIxError):
    """Every matching key was refused by its accessor or ownership check.

    The data exists but this caller may not read it; retrying will not help.
    """

    status = Status.ERR_NO_PERMISSIONS


class LookupTimeoutError(PMIxError):
    """A waiting lookup was not satisfied within its timeout.

    Nothing was consumed; the caller may retry or give up.
    """

    status = Status.ERR_TIMEOUT


class UnreachableError(PMIxError):
    """The server (daemon, master or remote data server) could not be reached.

    The connection was refused, lost mid-request, or the relay target is
    down.  The request may or may not have been applied if the loss happened
    after sending it.
    """

    status = Status.ERR_UNREACH


class BadParamError(PMIxError):
    """The request was malformed: wrong types, unknown range or persistence,
    empty key list, and so on.  The message names the problem; nothing in
    the store was changed."""

    status = Status.ERR_BAD_PARAM


class OutOfResourceError(PMIxError):
    """The publish is larger than the per-uid cap
    (``prte_data_server_max_size``): nothing was stored or evicted; or the
    connection already has ``pydvm_max_outstanding`` requests waiting: wait
    for some to finish."""

    status = Status.ERR_OUT_OF_RESOURCE


class NotFoundError(PMIxError):
    """No requested key is in the store (never published, unpublished,
    consumed by a first read, evicted or expired)."""

    status = Status.ERR_NOT_FOUND


class DuplicateKeyError(PMIxError):
    """A key of the publish collides with a stored one: another owner's
    (refused always) or the caller's own without ``replace=True``."""

    status = Status.ERR_DUPLICATE_KEY


_BY_STATUS: dict[Status, type[PMIxError]] = {
    cls.status: cls
    for cls in (
        NoPermissionsError,
        LookupTimeoutError,
        UnreachableError,
        BadParamError,
        OutOfResourceError,
        NotFoundError,
        DuplicateKeyError,
    )
}


def error_for(status: Status, message: str = "") -> PMIxError:
    """Return the exception instance matching a non-success ``status``."""
    cls = _BY_STATUS.get(status, PMIxError)
    if cls is PMIxError:
        return PMIxError(message, status=status)
    return cls(message)
