"""readers.contract.perprocess.PerProcess: one value per process, never an inherited one, dropped on pickle."""

from __future__ import annotations

import itertools
import os
import pickle

import pytest

from readers.contract.perprocess import PerProcess

_made = itertools.count()
CLOSED: list[tuple[int, int]] = []  # (pid, value) per close, in this process
INHERITED: list[int] = []


def make() -> int:
    return next(_made)


def close(value: int) -> None:
    CLOSED.append((os.getpid(), value))


def drop_inherited(value: int) -> None:
    INHERITED.append(value)


@pytest.fixture(autouse=True)
def _clean():
    CLOSED.clear(), INHERITED.clear()
    yield


def in_child(fn) -> object:
    """Run ``fn()`` in a forked child; return what it returned (pickled through a pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.write(w, pickle.dumps(fn()))
            os.close(w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "child failed"
    return pickle.loads(data)


def test_created_once_on_first_use_and_closed_once():
    held = PerProcess(make, close)
    assert held.peek() is None and held.owner is None  # nothing made yet
    first = held.get()
    assert held.get() == first and held.peek() == first and held.owner == os.getpid()
    held.close()
    assert CLOSED == [(os.getpid(), first)] and held.peek() is None and held.owner is None
    held.close()  # idempotent: nothing left to close
    assert len(CLOSED) == 1
    assert held.get() != first  # re-created on demand


@pytest.mark.slow
def test_forked_child_makes_its_own_and_never_closes_the_parents():
    held = PerProcess(make, close, inherited=drop_inherited)
    parent_value = held.get()

    def child():
        seen = (held.peek(), held.owner)  # inherited: not this process's value
        closed_before = list(CLOSED)
        held.close()  # forgets the parent's value, closes nothing
        closed_by_forgetting = list(CLOSED)
        value = held.get()
        held.close()
        return seen, closed_before, closed_by_forgetting, value, list(CLOSED), list(INHERITED), os.getpid()

    seen, closed_before, closed_by_forgetting, value, closed, inherited, pid = in_child(child)
    assert seen == (None, os.getpid())
    assert closed_before == closed_by_forgetting == [], "the child closed the parent's value"
    assert inherited == [], "close() in the child should just forget; nothing was inherited by get()"
    assert value != parent_value and closed == [(pid, value)]
    assert held.get() == parent_value and held.owner == os.getpid()  # the parent's value is untouched
    assert CLOSED == [] and INHERITED == []


@pytest.mark.slow
def test_inherited_hook_sees_the_parents_value_once():
    held = PerProcess(make, close, inherited=drop_inherited)
    parent_value = held.get()

    def child():
        a = held.get()
        b = held.get()
        return a, b, list(INHERITED), list(CLOSED)

    a, b, inherited, closed = in_child(child)
    assert a == b != parent_value
    assert inherited == [parent_value] and closed == []  # released through the hook, never "closed"


def test_pickle_drops_the_value_keeps_the_recipe():
    held = PerProcess(make, close)
    value = held.get()
    copy = pickle.loads(pickle.dumps(held))
    assert copy.peek() is None and copy.owner is None
    other = copy.get()
    assert other != value and held.get() == value
    copy.close()
    assert CLOSED == [(os.getpid(), other)]


def test_a_failing_factory_leaves_the_holder_empty():
    attempts = []

    def flaky() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("no such file")
        return 42

    held = PerProcess(flaky, close)
    with pytest.raises(OSError):
        held.get()
    assert held.owner is None and held.peek() is None
    held.close()
    assert CLOSED == []
    assert held.get() == 42
