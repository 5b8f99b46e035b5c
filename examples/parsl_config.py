"""A Parsl configuration for the DVM of ``$PYDVM_URI``: HTEX's worker pools in
a block that is one job of the DVM (pydvm's provider, ``pydvm.parsl``).

Parsl's own test suite takes it as it is (``fresh_config()``, as its
``--config`` files define)::

    export PYDVM_URI=$(pydvm start --daemonize)
    pytest --pyargs parsl.tests -k "not cleannet and not unix_filesystem_permissions_required" \\
        --config examples/parsl_config.py

and a workflow loads it with ``parsl.load(fresh_config())``.  HTEX starts
``interchange.py`` and ``process_worker_pool.py`` by name: the ``bin``
directory of the Python that has Parsl must be on ``PATH``.
"""

from parsl.config import Config
from parsl.executors import HighThroughputExecutor

from pydvm.parsl import PydvmProvider


def fresh_config():
    return Config(
        executors=[
            HighThroughputExecutor(
                label="htex_pydvm",
                loopback_address="::1",
                worker_debug=True,
                cores_per_worker=1,
                encrypted=True,
                provider=PydvmProvider(        # the DVM of $PYDVM_URI
                    init_blocks=1,
                    max_blocks=1,
                ),
            )
        ],
        strategy="none",
    )
