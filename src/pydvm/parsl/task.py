"""What a ``python_app`` of :class:`~pydvm.parsl.executor.PydvmExecutor` runs.

Each such app is a DVM job of its own: ``python .../pydvm/parsl/task.py
IN OUT LOG`` on each of its ranks (by its path: the ``pydvm`` package is
not imported).  ``IN`` holds the function and its arguments as Parsl's
``pack_apply_message`` packed them; every rank calls it, and rank 0
writes ``OUT``: Parsl's ``serialize((True, value))``, or ``(False,
exception)`` when the call raised (a ``python_app``'s own exceptions come
back as the ``RemoteExceptionWrapper`` Parsl wraps them in, as from any
executor).  The file appears whole (written beside, then renamed) or not
at all; the executor reads it when the job's end is pushed to it.  What
the ranks print goes to ``LOG.out`` and ``LOG.err`` (appended to, every
rank's), written here on the node: the job's own output is not forwarded,
which would cost each app a round of output handling at the DVM.

Parsl's serializer is loaded without running ``parsl/__init__.py``, which
imports the DataFlowKernel and every executor -- seconds on a busy node,
paid by every app here, where HTEX's workers pay it once.  The package is
put in ``sys.modules`` bare (:func:`bare_parsl`), its submodules imported
as usual; the first import of another of its modules (the module of an
app's function, importing ``parsl.app.app``), or use of a name of
``parsl`` itself (``parsl.python_app``), runs ``__init__.py`` then, in
the same module object -- so a function that needs the whole of Parsl
gets it, and one that does not never waits for it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any


#: Parsl's modules a python_app's job loads without ``parsl/__init__.py``:
#: the serializer, and what Parsl's ``wrap_error`` imports when an app
#: raises (closed under their own imports).
LIGHT = frozenset({"parsl.errors", "parsl.serialize", "parsl.serialize.base",
                   "parsl.serialize.concretes", "parsl.serialize.errors",
                   "parsl.serialize.facade", "parsl.app", "parsl.app.errors",
                   "parsl.data_provider", "parsl.data_provider.files"})


class _Loaded:
    """A loader handing the import system a module already imported (by
    ``parsl/__init__.py``, run while the module was being looked for)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec: Any) -> Any:
        return self.module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = self.spec  # its own, which the import system replaced


class _WholeParsl:
    """On the first import of a Parsl module outside :data:`LIGHT` (the
    user's module importing ``parsl.app.app``...), run ``parsl/__init__.py``
    first -- it imports Parsl's modules in the order they need."""

    def __init__(self, init: Any) -> None:
        self.init = init

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if not name.startswith("parsl.") or name in LIGHT or name in sys.modules:
            return None
        self.init()
        mod = sys.modules.get(name)
        if mod is None:  # not one __init__ imports: found the usual way
            return None
        from importlib.machinery import ModuleSpec

        # the import system answers with the module's own __spec__ when the
        # module appeared meanwhile, and would load that again: until our
        # loader puts it back, the module's spec is ours
        spec = ModuleSpec(name, _Loaded(mod), origin=getattr(mod.__spec__, "origin", None))
        mod.__spec__ = spec
        return spec


def bare_parsl() -> None:
    """Make ``import parsl.X`` load X without ``parsl/__init__.py`` (see the
    module docstring) for the modules of :data:`LIGHT`; the first import of
    any other, or use of a name of ``parsl`` itself, runs ``__init__.py``
    then, in the same module object.  Nothing if ``parsl`` is imported
    already."""
    if "parsl" in sys.modules:
        return
    spec = importlib.util.find_spec("parsl")
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return  # not a package we know how to load: import it the usual way
    mod = importlib.util.module_from_spec(spec)
    done = []

    def init() -> None:
        if done:
            return
        done.append(True)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not finder]
        mod.__dict__.pop("__getattr__", None)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]

    def __getattr__(name: str) -> Any:
        sub = sys.modules.get(f"parsl.{name}")
        if sub is not None:  # a submodule being imported (its attribute is set after)
            return sub
        init()
        return getattr(mod, name)

    finder = _WholeParsl(init)
    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    sys.modules["parsl"] = mod
    sys.meta_path.insert(0, finder)


def run(packed: bytes) -> tuple[bool, object]:
    """Call the packed function: ``(True, its value)`` or ``(False, what it raised)``."""
    from parsl.serialize import unpack_apply_message

    try:
        fn, args, kwargs = unpack_apply_message(packed)
        return True, fn(*args, **kwargs)
    except BaseException as exc:  # SystemExit too: the app's outcome, not ours
        return False, exc


def encode(outcome: tuple[bool, object]) -> bytes:
    """``outcome`` serialized by Parsl; a value that cannot be becomes the
    error saying so."""
    from parsl.serialize import serialize

    try:
        return serialize(outcome)
    except Exception as exc:
        what = "result" if outcome[0] else "exception"
        return serialize((False, RuntimeError(
            f"the app's {what} ({type(outcome[1]).__name__}) could not be serialized "
            f"to be sent back: {exc!r}")))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # run by its path (not -m: pydvm's own __init__ is not needed here), its
    # directory came first on sys.path: its modules must not hide the app's
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    if len(argv) != 3:
        print("usage: python task.py IN OUT LOG (a rank of a PydvmExecutor app)",
              file=sys.stderr)
        return 2
    inp, out, log = argv
    for fd, ext in ((1, "out"), (2, "err")):
        f = os.open(f"{log}.{ext}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)
    bare_parsl()
    with open(inp, "rb") as f:
        packed = f.read()
    outcome = run(packed)
    if int(os.environ.get("PYDVM_RANK", "0")) != 0:
        return 0
    data = encode(outcome)
    tmp = f"{out}.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
