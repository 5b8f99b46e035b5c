"""What runs on each rank of a Parsl block that keeps its nodes for MPI apps.

A :class:`~pydvm.parsl.provider.PydvmProvider` block with Parsl's
``SimpleLauncher`` (what MPI mode asks for) is a DVM job of one rank per
node: ``python -m pydvm.parsl.block SCRIPT``.  Rank 0 runs the block's
script (the worker pool) with ``PBS_NODEFILE`` naming the job's nodes --
where Parsl's MPI scheduler reads a block's nodes from -- and the other
ranks keep their nodes' slots until the pool has ended.  They meet in the
DVM's store (``namespace`` range: this job's processes only): each other
rank publishes its node, rank 0 waits for them all, writes the node file,
runs the script, and publishes its end, which the others wait for.  Killing
the block (Parsl's scale-in) ends every rank at once.
"""

from __future__ import annotations

import os
import subprocess
import sys

NODE_KEY = "parsl-block/node/{rank}"
DONE_KEY = "parsl-block/done"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pydvm.parsl.block SCRIPT (a rank of a DVM job)",
              file=sys.stderr)
        return 2
    script = argv[0]
    from pydvm import Client, Range

    rank = int(os.environ["PYDVM_RANK"])
    size = int(os.environ["PYDVM_JOB_SIZE"])
    node = os.environ["PYDVM_NODE"]
    with Client() as c:
        if rank:
            c.publish({NODE_KEY.format(rank=rank): node}, range=Range.NAMESPACE)
            c.lookup(DONE_KEY, range=Range.NAMESPACE, wait=True)
            return 0
        keys = [NODE_KEY.format(rank=r) for r in range(1, size)]
        found = c.lookup(keys, range=Range.NAMESPACE, wait=True) if keys else {}
        nodes = [node] + [str(found[k]) for k in keys]
        nodefile = script + ".nodes"
        with open(nodefile, "w") as f:
            f.write("".join(n + "\n" for n in nodes))
        env = dict(os.environ, PBS_NODEFILE=nodefile)
        env.pop("SLURM_NODELIST", None)  # Parsl would ask Slurm first
        try:
            rc = subprocess.call(["/bin/bash", script], env=env)
        finally:
            c.publish({DONE_KEY: 1}, range=Range.NAMESPACE)
        return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
