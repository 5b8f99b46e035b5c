"""torchrun's way in: the ``torchrun.handlers`` entry point names :func:`handler_creator`.

``torchrun --rdzv-backend=pydvm`` finds pydvm's elastic rendezvous through
this entry point (``pyproject.toml``), which torch loads while it imports
its own rendezvous package.  So this module imports nothing at import time:
the handler (:func:`pydvm.torch.elastic.create_handler`) is imported on the
first rendezvous.  ``import pydvm.torch`` registers the same
:func:`create_handler`, so the two registrations never disagree.
"""

from __future__ import annotations


def create_handler(params):
    """Make the ``pydvm`` rendezvous handler (see :mod:`pydvm.torch.elastic`)."""
    from .torch.elastic import create_handler as create

    return create(params)


def handler_creator():
    """What the entry point names: torch registers what it returns under
    the entry point's name, ``pydvm``."""
    return create_handler
