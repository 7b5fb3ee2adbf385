# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit-test fixtures made once per pytest worker, outside ansible-test's per-test fork.

``ansible-test units`` runs every test in a fork of its pytest worker (the ``ansible_forked`` plugin)
and ends the fork with ``os._exit``. A session fixture is therefore set up again inside every fork
that uses it and never torn down: each swtpm and etcd such a fixture started outlived the run (39
etcds holding 4.7 GB of tmpfs and 49 swtpms per run, until a later run ran out of memory).

A fixture declared with :func:`worker_fixture` is made by the worker itself, just before it forks for
the first test that needs it (the ``pytest_runtest_protocol`` wrapper in ``tests/unit/conftest.py``),
inherited by every later fork, and ended once when the worker's session finishes. Under plain pytest,
with no fork, it is an ordinary session fixture.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional

import pytest

_FACTORIES: Dict[str, Callable[[Callable[[str], Any]], Any]] = {}
_WANTED: Dict[str, Callable[[Any], bool]] = {}  # name -> item predicate, for fixtures a test asks for at run time
_VALUES: Dict[str, Any] = {}
_CLEANUPS: List[Callable[[], None]] = []


def worker_fixture(factory=None, *, wanted: Optional[Callable[[Any], bool]] = None):
    """Declares a worker fixture named after ``factory``. ``factory(get)`` returns the value, or yields
    it and cleans up after the yield; ``get(name)`` gives another worker fixture's value. ``wanted(item)``
    says whether a test needs it though it does not name it (``request.getfixturevalue``)."""
    if factory is None:
        return lambda func: worker_fixture(func, wanted=wanted)
    name = factory.__name__
    _FACTORIES[name] = factory
    if wanted is not None:
        _WANTED[name] = wanted

    @pytest.fixture(scope="session", name=name)
    def _fixture():
        return value_of(name)

    return _fixture


def value_of(name: str) -> Any:
    """The value of the worker fixture ``name``, made now if no one made it yet."""
    if name not in _VALUES:
        made = _FACTORIES[name](value_of)
        if inspect.isgenerator(made):
            value = next(made)
            _CLEANUPS.append(lambda: next(made, None))
        else:
            value = made
        _VALUES[name] = value
    return _VALUES[name]


def prepare(item) -> None:
    """Makes, in this process, every worker fixture the test ``item`` needs (called before the fork).
    A failure is left for the fixture itself to raise again inside the test, where it is reported."""
    names = list(item.fixturenames) + [name for name, wanted in _WANTED.items() if wanted(item)]
    for name in names:
        if name in _FACTORIES and name not in _VALUES:
            try:
                value_of(name)
            except (Exception, pytest.skip.Exception):  # pylint: disable=broad-except
                pass


def close_all() -> None:
    """Ends every worker fixture made in this process, the last made first."""
    while _CLEANUPS:
        cleanup = _CLEANUPS.pop()
        try:
            cleanup()
        except Exception:  # pylint: disable=broad-except
            pass
    _VALUES.clear()
