"""The blocking framed connection, under its client name: it lives in
:mod:`pydvm.channel` (below both the client and :mod:`pydvm.wire`)."""

from ..channel import (  # noqa: F401 (re-exported)
    AVAILABLE_READS, CLIENT_SPIN_US_DEFAULT, SPIN_BACKOFF_MAX, BlockingChannel, _client_spin,
)
