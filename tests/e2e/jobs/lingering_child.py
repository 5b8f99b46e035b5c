"""A job process whose child outlives it, holding a client connection.

The child connects as this process (it inherits the environment), tells the
parent it is connected, and the parent exits.  The child then waits for the
file named by argv[1] (the test's go signal, sent once the daemon has reaped
the parent) and tries to publish on the connection it already holds, then on
a new one.  It prints one line per attempt: ``HELD <status name>`` and
``NEW <status name>``.
"""

import os
import sys
import time

from pydvm import Client
from pydvm.errors import PMIxError

go = sys.argv[1]
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    # Detach from the job's output, as a daemonised helper would.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    out = open(sys.argv[2], "w", buffering=1)
    c = Client()
    os.write(w, b"x")
    os.close(w)
    deadline = time.monotonic() + 40
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    for label, make in (("HELD", lambda: c), ("NEW", Client)):
        try:
            make().publish({f"late-{label.lower()}": "1"}, persistence=None)
            out.write(f"{label} PMIX_SUCCESS\n")
        except PMIxError as exc:
            out.write(f"{label} {exc.status.pmix_name}\n")
    out.close()
    os._exit(0)
os.close(w)
os.read(r, 1)  # the child is connected
print("PARENT EXITING", os.getpid(), flush=True)
