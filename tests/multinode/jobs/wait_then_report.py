"""Park a waiting lookup, then write its outcome to a file (argv[1]).

Used when the master dies: job output is forwarded through the master, so
the result goes to a file.  SIGTERM is ignored so that the daemon's kill
(TERM, then KILL after a grace period) cannot race the report.
"""

import signal
import sys

from pydvm import Client
from pydvm.errors import PMIxError

signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = sys.argv[1]
with Client() as c:
    with open(out + ".ready", "w") as f:
        f.write("ready\n")
    try:
        c.lookup(["never-published"], wait=True, timeout=120)
        result = "ANSWERED"
    except PMIxError as exc:
        result = exc.status.pmix_name
with open(out, "w") as f:
    f.write(result + "\n")
