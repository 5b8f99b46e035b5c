"""A pytest plugin (``-p parsl_pytest9``) letting Parsl's own test suite load
under pytest 9.

Parsl 2026.10.26's ``parsl/tests/conftest.py`` declares
``pytest_ignore_collect(path)``: the ``py.path`` argument pytest 8 still
passed (deprecated) and pytest 9 no longer does, so pytest 9 refuses the
conftest before collecting anything.  This plugin gives that one hook the
argument it asks for -- an object with the ``strpath`` the hook reads --
made from pytest 9's ``collection_path``; nothing else of Parsl's suite is
touched (but that its "don't ignore", False, is
now None, "no opinion", so that ``--ignore`` still works), and a conftest without the old signature is registered as it is.
"""

from __future__ import annotations

import inspect
import types

from _pytest.config import PytestPluginManager


class _StrPath:
    __slots__ = ("strpath",)

    def __init__(self, path) -> None:
        self.strpath = str(path)


def _adapt(module: types.ModuleType) -> None:
    old = getattr(module, "pytest_ignore_collect", None)
    if old is None or list(inspect.signature(old).parameters) != ["path"]:
        return

    def pytest_ignore_collect(collection_path):
        # True ignores the path; its False becomes "no opinion" (None), so that
        # pytest's own --ignore and --ignore-glob still apply after it
        return True if old(_StrPath(collection_path)) else None

    module.pytest_ignore_collect = pytest_ignore_collect


_register_conftest = PytestPluginManager.consider_conftest


def _consider_conftest(self, conftestmodule, registration_name):
    _adapt(conftestmodule)
    return _register_conftest(self, conftestmodule, registration_name)


PytestPluginManager.consider_conftest = _consider_conftest
