"""Writes 20 stdout lines, each in two pieces, and 20 stderr lines."""

import os
import sys
import time

rank = os.environ["PYDVM_RANK"]
for i in range(20):
    sys.stdout.write(f"out {rank} {i} ")
    sys.stdout.flush()
    time.sleep(0.005)  # the two halves reach the daemon separately
    sys.stdout.write("tail\n")
    sys.stdout.flush()
    sys.stderr.write(f"err {rank} {i}\n")
    sys.stderr.flush()
