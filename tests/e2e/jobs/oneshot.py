"""Prints its daemon's pid and identity; rank 1 exits 4."""

import os
import sys

print(f"DAEMON {os.getppid()} NS {os.environ['PYDVM_NSPACE']} RANK {os.environ['PYDVM_RANK']}",
      flush=True)
sys.exit(4 if os.environ["PYDVM_RANK"] == "1" else 0)
