"""The ``mpiexec`` an MPI app of a Parsl block on a DVM runs (``$PARSL_MPI_PREFIX``).

In MPI mode (``HighThroughputExecutor(enable_mpi_mode=True,
mpi_launcher="mpiexec")`` or ``MPIExecutor``), Parsl's worker pool hands
each app the nodes it picked from its block and sets
``PARSL_MPI_PREFIX="mpiexec -n RANKS -ppn PER_NODE -hosts A,B [launcher_options]"``.
A block of :class:`~pydvm.parsl.provider.PydvmProvider` puts a directory
holding this ``mpiexec`` first on its ``PATH``, so ``$PARSL_MPI_PREFIX
./app`` becomes ``pydvm run -n RANKS --npernode PER_NODE --host A,B ./app``
on the block's DVM: the app's ranks are a DVM job on those nodes, with the
DVM's PMIx server for Open MPI.

Which PMI the ranks get is :data:`PMI`'s entry for the block's ``pmi``
(``$PYDVM_PARSL_PMI``): the ``pydvm run`` options that flavour needs.  A
flavour the DVM serves is added there (and becomes a valid ``pmi`` of the
provider) with nothing else to change.
"""

from __future__ import annotations

import os
import sys

#: PMI flavour -> the ``pydvm run`` options its ranks need.  ``pmix``: Open
#: MPI (and any PMIx client) finds the DVM's PMIx server in the environment
#: every rank is given; nothing to add.
PMI: dict[str, list[str]] = {
    "pmix": [],
    # MPICH, Intel MPI, MVAPICH: PMI-1 on every node (docs/mpiexec.md)
    "pmi1": ["--mpi", "pmi1"],
    # read off the program, as pydvm run does by default
    "auto": ["--mpi", "auto"],
}

#: Hydra/Open MPI option spellings Parsl's prefix and users write -> pydvm run's.
_VALUED = {
    "-n": "-n", "-np": "-n", "--n": "-n", "--np": "-n",
    "-ppn": "--npernode", "--ppn": "--npernode", "-npernode": "--npernode",
    "--npernode": "--npernode",
    "-hosts": "--host", "--hosts": "--host", "-host": "--host", "--host": "--host",
}


def _count(opt: str, value: str) -> str | None:
    """A rank count as Parsl writes it (``"2"``, ``"1.0"``, ``"None"``)."""
    if value in ("", "None"):
        return None
    try:
        f = float(value)
    except ValueError:
        raise ValueError(f"mpiexec: {opt} takes a number, not {value!r}") from None
    if f != int(f) or f < 1:
        raise ValueError(f"mpiexec: {opt} {value}: a whole number of ranks >= 1 is needed")
    return str(int(f))


def run_args(argv: list[str], pmi: str = "pmix") -> list[str]:
    """``pydvm run``'s arguments for ``mpiexec ARGV`` (pure).

    ``-n``/``-np``, ``-ppn``/``-npernode`` and ``-hosts``/``-host`` are
    translated; any other option before the command (Parsl's
    ``launcher_options``) is passed on as it is -- ``pydvm run`` takes
    mpirun's options and names what it refuses.  The job never waits in
    the DVM's queue (``--no-queue``): its nodes are the block's, which the
    block's own job keeps.  ValueError for a missing command, a bad count or
    an unknown ``pmi``."""
    if pmi not in PMI:
        raise ValueError(f"mpiexec: PMI {pmi!r} is not one this DVM provider serves "
                         f"(known: {', '.join(sorted(PMI))})")
    out = ["--no-queue", *PMI[pmi]]
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-"):
            break
        name, eq, val = a.partition("=")
        if name in _VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"mpiexec: {a} needs a value")
                val = argv[i + 1]
                i += 1
            i += 1
            mapped = _VALUED[name]
            if mapped != "--host":
                val = _count(name, val)
            elif val in ("", "None"):
                val = None
            if val is not None:
                out += [mapped, val]
            continue
        # another mpirun option: passed on, its value (if any) after it, in order
        out.append(a)
        i += 1
    command = argv[i:]
    if not command:
        raise ValueError("mpiexec: no command to run")
    return out + command


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = run_args(argv, os.environ.get("PYDVM_PARSL_PMI", "auto"))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    os.execvp(sys.executable, [sys.executable, "-m", "pydvm", "run", *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
