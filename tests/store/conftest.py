"""Fixtures for the pure data store tests.

Time is a :class:`FakeScheduler` used as both clock and timer: it moves only
through ``sched.advance()``.  Every store built through ``env`` (including
the default ``store`` fixture) has its invariants checked at teardown, and so
has the scheduler (its timer heap's bound).
"""

from __future__ import annotations

from typing import Hashable

import pytest

from pydvm.store import DataStore, Reply, StoreParams
from pydvm.store.clock import FakeScheduler
from pydvm.store import DEFAULT_MAX_SIZE, DEFAULT_TIMEOUT


class StoreEnv:
    """A fake scheduler, an answer sink, and the stores built on them."""

    def __init__(self) -> None:
        self.sched = FakeScheduler()
        self.answers: list[tuple[Hashable, Reply]] = []
        self.stores: list[DataStore] = []

    def sink(self, ticket: Hashable, reply: Reply) -> None:
        self.answers.append((ticket, reply))

    def make(
        self,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_size: int = DEFAULT_MAX_SIZE,
        verbose: int = 0,
        dvm_nspace: str = "pydvm",
        name: str = "test",
    ) -> DataStore:
        store = DataStore(
            name=name,
            clock=self.sched,
            timer=self.sched,
            on_answer=self.sink,
            params=StoreParams(timeout=timeout, max_size=max_size, verbose=verbose),
            dvm_nspace=dvm_nspace,
        )
        self.stores.append(store)
        return store

    def answers_for(self, ticket: Hashable) -> list[Reply]:
        return [r for t, r in self.answers if t == ticket]


@pytest.fixture
def env():
    e = StoreEnv()
    yield e
    for s in e.stores:
        s.check_invariants()
    e.sched.check_invariants()


@pytest.fixture
def sched(env) -> FakeScheduler:
    return env.sched


@pytest.fixture
def answers(env) -> list:
    return env.answers


@pytest.fixture
def store(env) -> DataStore:
    """A store with default parameters (timeout 300 s, cap 16 MiB)."""
    return env.make()
