# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The accepted measurement sets of a running cluster (a rolling image upgrade, docs/site.md "Upgrade the image").

The admin gives the Coordinator a new policy document (``SetMeasurements``, admin channel): the file's exact bytes
and, where a measurements key is pinned, its detached signature. The Coordinator checks it as every agent does
(``check_document``: the signature BEFORE parsing, at least one enforced PCR per set, a version above the one in
force), refuses to drop a set that a peer still runs (the set each peer matched at its last re-attestation,
``record_peer_set``; a peer not re-attested since is counted as unknown and refuses too) and to stop accepting the
agent a peer runs (its PCR 13 at its last re-attestation, ``record_peer_agent``; the same rule, over the document's
``agents`` or, where it lists none, the Coordinator's own agent: attestation/agent_measurement.py), keeps it in its store
(shared with further Coordinators, which follow it) and applies it itself (``on_apply``: the agent writes its
policy file, seals its storage key to the sets and swaps its validators). Nodes see the version in GetUpdate's
answer and fetch the document (``GetMeasurements``, vpnapi, PeerAuth'd); they check it again with their own
pinned key: the Coordinator is a relay, not a signer.

Store keys: ``measurementsDocument`` (JSON ``{"version", "document": b64, "signature"}``),
``measurementSetOf<vpn_ip>`` (the name of the set that peer matched last) and ``agentOf<vpn_ip>`` (JSON ``{"name",
"value": hex}``: the accepted agent that peer's PCR 13 matched last).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import IMAGE_AGENT, accepted_values
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    MeasurementSets, as_sets, parse_policy, policy_version)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import require_enforced_pcr
from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_yaml
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError

KEY_DOCUMENT = "measurementsDocument"
KEY_PEER_SET_PREFIX = "measurementSetOf"
KEY_PEER_AGENT_PREFIX = "agentOf"
MAX_DOCUMENT = 1024 * 1024
UNKNOWN = "(not re-attested since the sets were last set)"
VERSION_CACHE_SECONDS = 1.0  # GetUpdate says the version on every poll: read from the store at most this often


def check_document(document: bytes, signature: Optional[str], pub_key: Any, current: Any = None) -> MeasurementSets:
    """The accepted sets of ``document`` (a policy file's exact bytes), checked as an agent checks its policy file:
    with a pinned ``pub_key`` (attestation/signature.py) the detached ``signature`` must verify BEFORE anything is
    parsed; every set enforces a PCR; the version is not below ``current``'s. InputError naming the reason."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature as sig

    if not isinstance(document, (bytes, bytearray)) or not 0 < len(document) <= MAX_DOCUMENT:
        raise InputError("document", "a measurements file of 1 to %d bytes" % MAX_DOCUMENT,
                         "%d bytes" % len(document or b""))
    if pub_key is not None:
        if not signature:
            raise InputError("signature", "the document's detached signature: a measurements public key is pinned on "
                             "this peer, and an unsigned document is never accepted", None)
        sig.verify_blob(pub_key, bytes(document), signature.encode("ascii", "replace"), "measurements document")
    try:
        text = bytes(document).decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError("document", "UTF-8 text", "an invalid byte at offset %d" % err.start) from None
    sets = as_sets(require_enforced_pcr(parse_policy(load_yaml(text, "document", int_keys=True)), "the document",
                                        "document"))
    if current is not None and sets.version < policy_version(current):
        raise InputError("version", "a version of at least %d (the one in force): an older document would bring "
                         "back what was retired" % policy_version(current), sets.version)
    return sets


class AcceptedMeasurements:
    """The accepted sets on this peer. ``policy``: the agent's policy in force (agent/measurement_policy.py), which
    gives ``pub_key`` (the pinned measurements key, or None), ``current()`` (the policy in force here),
    ``apply(document, signature, sets)`` (``on_apply``), ``own_set()`` (the set this peer's own PCRs match, or
    None) and ``own_agent()`` ((name, PCR 13 value) of the agent this peer runs, or None). None: no policy here
    (nothing applied, no own set or agent)."""

    def __init__(self, context: PeerContext, policy: Optional[Any] = None):
        self.context = context
        self.pub_key: Any = policy.pub_key if policy is not None else None
        self.current: Callable[[], Any] = policy.current if policy is not None else (lambda: None)
        self.on_apply: Optional[Callable[[bytes, Optional[str], MeasurementSets], Any]] = (
            policy.apply if policy is not None else None)
        self.own_set: Callable[[], Optional[str]] = policy.own_set if policy is not None else (lambda: None)
        self.own_agent: Callable[[], Optional[Tuple[str, bytes]]] = (
            policy.own_agent if policy is not None else (lambda: None))
        self._lock = threading.Lock()
        self._recorded: Dict[str, str] = {}  # vpn_ip -> set, as last written to the store
        self._recorded_agents: Dict[str, Tuple[str, str]] = {}  # vpn_ip -> (agent name, value hex), as written
        self._version = (0.0, 0)  # (when read, version): version()'s cache
        self._unread = False  # the last store read failed (logged once)

    # -- the Coordinator's record of who runs what
    def record_peer_set(self, vpn_ip: str, name: Optional[str]) -> None:
        """The set ``vpn_ip`` matched at its re-attestation (written only when it changed)."""
        if not name or self._recorded.get(vpn_ip) == name:
            return
        try:
            self.context.store.put(KEY_PEER_SET_PREFIX + vpn_ip, name.encode("utf-8"))
        except StoreError as err:  # no majority (etcd): the attestation stands; written at a later round
            self.context.log("measurement_set_unrecorded", level="warning", peer=vpn_ip, error=str(err)[:200])
            return
        self._recorded[vpn_ip] = name

    def record_peer_agent(self, vpn_ip: str, agent: Optional[Tuple[str, bytes]]) -> None:
        """The accepted agent (name, PCR 13 value) ``vpn_ip`` matched at its re-attestation (written when it changed)."""
        if not agent:
            return
        record = (agent[0], bytes(agent[1]).hex())
        if self._recorded_agents.get(vpn_ip) == record:
            return
        try:
            self.context.store.put(KEY_PEER_AGENT_PREFIX + vpn_ip,
                                   json.dumps({"name": record[0], "value": record[1]}).encode("utf-8"))
        except StoreError as err:  # as record_peer_set: written at a later round
            self.context.log("agent_unrecorded", level="warning", peer=vpn_ip, error=str(err)[:200])
            return
        self._recorded_agents[vpn_ip] = record

    def peer_agent_records(self) -> Dict[str, Optional[Tuple[str, str]]]:
        """``{vpn_ip: (agent name, PCR 13 value hex)}`` of the peers of the registry (this Coordinator: its own
        agent); None for a peer not re-attested since."""
        registry = self.context.peer_registry.current()
        stored = {}
        for key, value in self.context.store.items(KEY_PEER_AGENT_PREFIX):
            try:
                record = json.loads(value.decode("utf-8"))
                stored[key[len(KEY_PEER_AGENT_PREFIX):]] = (str(record["name"]), str(record["value"]))
            except (ValueError, KeyError, TypeError):
                continue  # unreadable: as if not re-attested since
        out: Dict[str, Optional[Tuple[str, str]]] = {}
        for peer in (registry.peers.peers.values() if registry is not None else ()):
            if peer.vpn_ip == self.context.vpn_ip:
                own = self.own_agent()
                out[peer.vpn_ip] = (own[0], bytes(own[1]).hex()) if own else None
            else:
                out[peer.vpn_ip] = stored.get(peer.vpn_ip)
        return out

    def peer_agents(self) -> Dict[str, str]:
        """``{vpn_ip: agent name}`` (attestation/agent_measurement.py OWN_AGENT where the document lists no agents);
        UNKNOWN for a peer not re-attested since."""
        return {ip: record[0] if record else UNKNOWN for ip, record in self.peer_agent_records().items()}

    def peer_sets(self) -> Dict[str, str]:
        """``{vpn_ip: set name}`` of the peers of the registry (this Coordinator included); UNKNOWN for a peer
        not re-attested since."""
        registry = self.context.peer_registry.current()
        stored = {key[len(KEY_PEER_SET_PREFIX):]: value.decode("utf-8", "replace")
                  for key, value in self.context.store.items(KEY_PEER_SET_PREFIX)}
        out = {}
        for peer in (registry.peers.peers.values() if registry is not None else ()):
            if peer.vpn_ip == self.context.vpn_ip:
                out[peer.vpn_ip] = self.own_set() or UNKNOWN
            else:
                out[peer.vpn_ip] = stored.get(peer.vpn_ip, UNKNOWN)
        return out

    # -- the stored document
    def stored(self) -> Optional[Dict[str, Any]]:
        raw = self.context.store.get_default(KEY_DOCUMENT)
        if raw is None:
            return None
        doc = json.loads(raw.decode("utf-8"))
        doc["document"] = base64.b64decode(doc["document"])
        return doc

    def version(self) -> int:
        """The version in force (the stored document's, else the policy file's), for GetUpdate's answer: at most one
        store read a second, and that one a ``peek`` (the member's own copy, no majority needed); when the store
        cannot answer, the version last read (a poll never waits for, or fails with, the store)."""
        read_at, version = self._version
        now = time.monotonic()
        if read_at != 0.0 and now - read_at < VERSION_CACHE_SECONDS:
            return version
        try:
            raw = self.context.store.peek(KEY_DOCUMENT)
            version = int(json.loads(raw.decode("utf-8"))["version"]) if raw is not None else policy_version(self.current())
        except (StoreError, ValueError, KeyError, TypeError) as err:
            if read_at == 0.0:
                version = policy_version(self.current())
            if not self._unread:  # once until the store answers again
                self.context.log("measurements_version_unread", level="warning", error=str(err)[:200])
            self._unread = True
        else:
            self._unread = False
        self._version = (now, version)
        return version

    # -- SetMeasurements (admin channel, Coordinator)
    def set_measurements(self, document: Optional[bytes], signature: Optional[str], check: bool = False) -> Dict[str, Any]:
        """Checks, stores and applies a new document; idempotent (the same document again changes nothing); in
        check mode predicts only; without a document only reports what is in force. Refuses an older version,
        another document under the version in force, and the retirement of a set a peer still runs, naming the
        peers."""
        self.context.require_coordinator("SetMeasurements")
        with self._lock:
            stored = self.stored()
            current = self.current()
            if stored is not None:
                current = check_document(stored["document"], stored.get("signature"), None)
            current_sets = as_sets(current) if current is not None else None
            if document is None:
                return {"changed": False, "version": policy_version(current),
                        "sets": list(current_sets.sets) if current_sets else [], "added": [], "removed": [],
                        "peers": self.peer_sets(), "agents": self.peer_agents()}
            new = check_document(document, signature, self.pub_key, current)
            old_names = list(current_sets.sets) if current_sets is not None else []
            answer = {"version": new.version, "sets": list(new.sets), "changed": True,
                      "added": [n for n in new.sets if n not in old_names],
                      "removed": [n for n in old_names if n not in new.sets],
                      "peers": self.peer_sets(), "agents": self.peer_agents()}
            same = stored is not None and bytes(stored["document"]) == bytes(document)
            if same or (current_sets is not None and new == current_sets and stored is None):
                answer["changed"] = False
                # Stored, but not in force here (an apply that failed half-way): applied again below.
                if check or not same or policy_version(self.current()) >= new.version:
                    return answer
            else:
                self._check_change(current_sets, new, answer)
                if check:
                    return answer
                record = {"version": new.version, "document": base64.b64encode(bytes(document)).decode("ascii"),
                          "signature": signature}
                self.context.store.put(KEY_DOCUMENT, json.dumps(record).encode("utf-8"))
                self._version = (time.monotonic(), new.version)
                self.context.log("measurements_set", version=new.version, sets=",".join(new.sets),
                                 added=",".join(answer["added"]), removed=",".join(answer["removed"]))
            if self.on_apply is not None:
                self.on_apply(bytes(document), signature, new)
        return answer

    def _check_change(self, current_sets: Optional[MeasurementSets], new: MeasurementSets, answer: Dict[str, Any]) -> None:
        """Another document than the one in force: its version must be above, and no peer may be left on a set it
        retires."""
        if current_sets is None:
            return
        if new.version == current_sets.version:
            raise InputError("version", "a version above %d: version %d is in force with other sets (raise the "
                             "document's version)" % (current_sets.version, new.version), new.version)
        # A set dropped by name whose measurements another set of the document holds is renamed, not retired
        # (the plain policy's "default" named after its image): no peer can be left behind by it.
        retired = [n for n in answer["removed"] if current_sets.sets[n] not in new.sets.values()]
        running = self.running(retired, answer["peers"]) if retired else {}
        if running:
            peers = ", ".join("%s (%s)" % (ip, running[ip]) for ip in sorted(running))
            raise StateError("SetMeasurements: cannot retire %s: these peers still run it or were not re-attested "
                             "since: %s" % (", ".join(retired), peers))
        self._check_agents(current_sets, new)

    def _check_agents(self, current_sets: MeasurementSets, new: MeasurementSets) -> None:
        """No peer may be left running an agent the new document no longer accepts (its PCR 13 at its last
        re-attestation); where an accepted value goes, a peer not re-attested since refuses too."""
        own = self.own_agent()
        own_value = bytes(own[1]) if own else None
        old_values = accepted_values(current_sets, own_value)
        new_values = set(value.hex() for value in accepted_values(new, own_value).values())
        retired = [name for name, value in old_values.items() if value.hex() not in new_values]
        left = {}
        for ip, record in self.peer_agent_records().items():
            if record is not None and record[0] == IMAGE_AGENT:
                continue  # a node image's peer: no agent on PCR 13; retiring its image set is refused above
            if record is None:
                if retired:
                    left[ip] = UNKNOWN
            elif record[1] not in new_values:
                left[ip] = "%s=%s" % record
        if left:
            peers = ", ".join("%s (%s)" % (ip, left[ip]) for ip in sorted(left))
            if retired:
                raise StateError("SetMeasurements: cannot retire the agent %s: these peers still run it or were not "
                                 "re-attested since: %s" % (", ".join(retired), peers))
            raise StateError("SetMeasurements: the document accepts no agent these peers run: %s" % peers)

    # -- GetMeasurements (vpnapi, Coordinator)
    def get_measurements(self) -> Dict[str, Any]:
        self.context.require_coordinator("GetMeasurements")
        stored = self.stored()
        if stored is None:
            raise StateError("GetMeasurements: no measurements document was set on this cluster (SetMeasurements)")
        answer = {"version": int(stored["version"]), "document": stored["document"]}
        if stored.get("signature"):
            answer["signature"] = stored["signature"]
        return answer

    @staticmethod
    def running(names: List[str], peers: Dict[str, str]) -> Dict[str, str]:
        """Those of ``peers`` that run one of ``names``, or whose set is unknown."""
        return {ip: name for ip, name in peers.items() if name in names or name == UNKNOWN}
