"""A Parsl ``--config`` file for Parsl's own test suite: each app one job of
the DVM of ``$PYDVM_URI``, through pydvm's executor (no worker pools)::

    export PYDVM_URI=$(pydvm start --daemonize)
    pytest --pyargs parsl.tests -k "not cleannet and not unix_filesystem_permissions_required" \\
        --config tests/parsl/parsl_per_app_config.py
"""

from parsl.config import Config

from pydvm.parsl import PydvmExecutor


def fresh_config():
    return Config(executors=[PydvmExecutor(label="pydvm_per_app")], strategy="none")
