"""A job process that holds one client connection open while a test attacks its daemon.

Prints ``READY <server> <nspace> <rank> <node>`` once connected, waits (at most
``LIMIT`` seconds) for the file named by argv[1] to appear, then publishes and
looks up a key on the *same* connection and prints ``HELD <value>``.
"""

import os
import sys
import time

from pydvm import Client

LIMIT = 40.0

go = sys.argv[1]
with Client() as c:
    e = os.environ
    print("READY", e["PYDVM_SERVER"], e["PYDVM_NSPACE"], e["PYDVM_RANK"], e["PYDVM_NODE"],
          flush=True)
    deadline = time.monotonic() + LIMIT
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            print("NO GO", flush=True)
            sys.exit(3)
        time.sleep(0.02)
    c.publish({"held": "still-served"})
    r = c.lookup(["held"])
    print("HELD", r["held"], flush=True)
