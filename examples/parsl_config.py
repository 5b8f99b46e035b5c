"""A Parsl configuration for the DVM of ``$PYDVM_URI``: HTEX's worker pools in
a block that is one job of the DVM (pydvm's provider, ``pydvm.parsl``).

Parsl's own test suite takes it as it is (``fresh_config()``, as its
``--config`` files define)::

    export PYDVM_URI=$(pydvm start --daemonize)
    pytest --pyargs parsl.tests -k "not cleannet and not unix_filesystem_permissions_required" \\
        --config examples/parsl_config.py

and a workflow loads it with ``parsl.load(fresh_config())``.  Run it as a
program, it runs one app that way.  HTEX starts
``interchange.py`` and ``process_worker_pool.py`` by name: the ``bin``
directory of the Python that has Parsl must be on ``PATH``.

Run it on a DVM of this machine::

    export PYDVM_URI=$(pydvm start --daemonize)
    python3 examples/parsl_config.py
    pydvm stop
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


if __name__ == "__main__":
    import parsl
    from parsl.app.app import python_app

    @python_app
    def answer():
        import os
        return f"42 from a worker on DVM node {os.environ['PYDVM_NODE']}"

    with parsl.load(fresh_config()):
        print(answer().result())
