"""``pydvm run ARGS...`` whose run request carries a ``placement`` given as JSON
in ``PYDVM_TEST_PLACEMENT``: how tests/e2e/placed.py runs binding options the
command line does not take yet (the request is what the CLI will send)."""
import json
import os
import sys

placement = json.loads(os.environ.pop("PYDVM_TEST_PLACEMENT", "{}"))

from pydvm.cli import submit, tool, toolcommon  # noqa: E402

_request = toolcommon.run_request


def run_request(*a, **kw):
    r = _request(*a, **kw)
    r["placement"] = placement
    return r


toolcommon.run_request = submit.run_request = tool.run_request = run_request

from pydvm.cli import main  # noqa: E402

sys.exit(main(["run", *sys.argv[1:]]))
