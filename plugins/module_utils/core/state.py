# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""States, roles and the state machine of a peer (docs/protocol.md, "States"): states only advance, and any error
after the point of no return leaves ``Failed``."""

from __future__ import annotations

import enum
import threading
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import constants
from ansible_collections.constellation.cluster.plugins.module_utils.constants import (  # noqa: F401 pylint: disable=unused-import
    ROLE_COORDINATOR,
    ROLE_NODE,
    ROLE_UNKNOWN,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, StateError


class State(enum.IntEnum):
    """Values and names as Constellation's Coordinator (docs/protocol.md, "States")."""

    UNINITIALIZED = 0
    ACCEPTING_INIT = 1
    ACTIVATING_NODES = 2
    NODE_WAITING_FOR_CLUSTER_JOIN = 3
    IS_NODE = 4
    FAILED = 5

    @property
    def wire_name(self) -> str:
        return _STATE_NAMES[self]


_STATE_NAMES = {
    State.UNINITIALIZED: constants.STATE_UNINITIALIZED,
    State.ACCEPTING_INIT: constants.STATE_ACCEPTING_INIT,
    State.ACTIVATING_NODES: constants.STATE_ACTIVATING_NODES,
    State.NODE_WAITING_FOR_CLUSTER_JOIN: constants.STATE_NODE_WAITING_FOR_CLUSTER_JOIN,
    State.IS_NODE: constants.STATE_IS_NODE,
    State.FAILED: constants.STATE_FAILED,
}
# The states in which a peer is activated: its admin channel is open.
ACTIVATED = (State.ACTIVATING_NODES, State.IS_NODE)


class StateMachine:
    """A peer's state and role, with listeners. Thread-safe: ``mutex`` guards every transition."""

    def __init__(self, log: Optional[Callable[..., None]] = None):
        self.log = log or (lambda event, **fields: None)
        self.mutex = threading.RLock()
        self._state = State.UNINITIALIZED
        self._role = ROLE_UNKNOWN
        self.failure: Optional[str] = None
        self._listeners: List[Callable[[State], None]] = []

    @property
    def state(self) -> State:
        return self._state

    @property
    def role(self) -> str:
        return self._role

    def set_role(self, role: str) -> None:
        with self.mutex:
            self._role = role

    def on_state_change(self, listener: Callable[[State], None]) -> None:
        self._listeners.append(listener)

    def advance(self, new: State) -> None:
        with self.mutex:
            if new <= self._state and not (new == State.FAILED and self._state != State.FAILED):
                raise StateError("state cannot go from %s back to %s" % (self._state.wire_name, new.wire_name))
            old, self._state = self._state, new
        self.log("state", old=old.wire_name, new=new.wire_name)
        for listener in list(self._listeners):
            listener(new)

    def fail(self, what: str, err: BaseException) -> None:
        self.failure = "%s failed after the node lock: %s" % (what, err)
        self.log("failed", what=what, error=str(err) if isinstance(err, ConstellationError) else type(err).__name__)
        if self._state != State.FAILED:
            self.advance(State.FAILED)

    def require_state(self, method: str, *allowed: State) -> None:
        if self._state not in allowed:
            raise StateError("%s is allowed only in state %s; this node is %s"
                             % (method, " or ".join(s.wire_name for s in allowed), self._state.wire_name))

    def public_state(self) -> Dict[str, Any]:
        """What GetState tells anyone: state and role only (least disclosure)."""
        return {"state": self._state.wire_name, "state_code": int(self._state), "role": self._role}
