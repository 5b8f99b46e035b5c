"""tests/pmix/harness.py with every publish answered inside libpmix's upcall.

Used by ``bench/pmix/pmix_host.py`` (its ``floor`` row): the publish upcall returns
PMIX_OPERATION_SUCCEEDED at once, on libpmix's progress thread, without
handing the request to the event loop or storing anything.  What is left
is the cost of libpmix itself (client -> server -> client) plus one
ctypes upcall: the floor under any host that answers from its own loop.
Not a usable host (nothing is stored; every lookup fails).
"""

import runpy
import sys
from pathlib import Path

from pydvm.pmix import constants as C
from pydvm.pmix import server as S


def _answer_in_upcall(self, proc, info, ninfo, cbfunc, cbdata):
    return C.OPERATION_SUCCEEDED


S.PmixServer._up_publish = _answer_in_upcall
harness = Path(__file__).resolve().parents[2] / "tests" / "pmix" / "harness.py"
sys.argv = [str(harness), *sys.argv[1:]]
runpy.run_path(str(harness), run_name="__main__")
