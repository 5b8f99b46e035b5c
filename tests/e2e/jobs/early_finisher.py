"""Rank 0 (node a) exits early; rank 1 (node b) keeps running and checks that
its default-persistence (NSPACE) item survived a's share of the job ending."""

import subprocess
import time

from _common import RANK, Client, Persistence, out, present, wait_gone

with Client() as c:
    if RANK == 0:
        c.publish({"r0_proc": "x"}, persistence=Persistence.PROC)
        c.lookup(["r1_data"], wait=True, timeout=30)
        out(f"RANK0 EXIT on {c.node}")
    else:
        c.publish({"r1_data": "keep"})  # default persistence: NSPACE
        # r0_proc reads NOT_FOUND once the master has accounted rank 0's exit,
        # i.e. node a's whole share of this job has finished.
        out("R0 ACCOUNTED" if wait_gone(c, "r0_proc") else "R0 NOT ACCOUNTED")
        # Margin for anything node a might (wrongly) send after its exit report;
        # a longer pause only makes the check stricter.
        time.sleep(0.5)
        p = subprocess.run(["pydvm", "lookup", "r1_data"], capture_output=True, text=True,
                           timeout=30)
        out("CHILD " + " | ".join(p.stdout.splitlines()))
        out("SELF R1_DATA FOUND" if present(c, "r1_data") else "SELF R1_DATA NOT_FOUND")
        out(f"RANK1 on {c.node}")
