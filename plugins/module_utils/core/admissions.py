# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin's consent to joins (docs/security.md, "Consent to a join"): an allowlist of admitted EKs.

A node joins (IssueJoinTicket) only if the admin admitted its TPM: the SHA-256 of the TPM's EK public key
(hex of the SubjectPublicKeyInfo DER of its EK certificate) -> the name the admin gives the node (its
inventory name, also its kubelet node name). The proof comes from below the agent: with ``qemu-vtpm-ek`` the AK
that signs the join's attestation is trusted only through credential activation with that EK, which host
root can neither forge nor copy. An admission is bound on first use to the joining node's WireGuard key: a
second join with the same EK and another key is refused (a rebooted Node rejoins through IssueRejoinTicket).

The records live in the Coordinators' store (shared by every Coordinator, as evictions are):
``admittedEK<sha256>`` -> JSON ``{name, vpn_pub_key (null until the join), ts}``. The admin adds and removes
them with AdmitNodes (agent/admin.py). ``insecure_join_without_admission`` (agent config) lets any node that
passes attestation join, as autoscaling without the admin needs: safe only on a measured immutable image.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import REASON_NOT_ADMITTED, AccessDenied, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

KEY_ADMITTED_EK_PREFIX = "admittedEK"
MAX_ADMISSIONS_PER_CALL = 4096
_HEX64 = re.compile(r"\A[0-9a-f]{64}\Z")
# A Kubernetes node name (DNS-1123 subdomain), which is what the admin's name becomes.
_NODE_NAME = re.compile(r"\A[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
ADMISSION_HINT = "add it with add_nodes.yml / AdmitNodes"


def parse_ek_pub_sha256(value: Any, field: str = "ek_pub_sha256") -> str:
    """The hex SHA-256 of an EK's public key (SubjectPublicKeyInfo DER), lower case."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text is None or not _HEX64.match(text):
        raise InputError(field, "the hex SHA-256 of the EK's public key (SubjectPublicKeyInfo DER; 64 hex digits)",
                         value if isinstance(value, str) and len(value) <= 80 else None)
    return text


def parse_node_name(value: Any, field: str = "name") -> str:
    """A node's name as the admin gives it: a Kubernetes node name (lower-case DNS-1123 subdomain)."""
    if not isinstance(value, str) or not _NODE_NAME.match(value):
        raise InputError(field, "a node name (lower-case letters, digits, '-' and '.', at most 253 characters, "
                         "as Kubernetes names nodes)", value if isinstance(value, str) and len(value) <= 80 else None)
    return value


def _load(raw: Optional[bytes], ek: str) -> Optional[dict]:
    if raw is None:
        return None
    try:
        record = json.loads(raw)
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            raise ValueError("not an admission")
        return record
    except ValueError:
        raise StoreError("the stored admission of EK %s is invalid" % ek) from None


def _dump(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode("utf-8")


class Admissions:
    """The admitted EKs over the peer's ``PeerContext``. ``insecure_join_without_admission``: the agent's option
    (its config); True lets any attested node join (warned at every start, reported in GetState)."""

    def __init__(self, context: PeerContext, insecure_join_without_admission: bool = False):
        self.context = context
        self.insecure_join_without_admission = bool(insecure_join_without_admission)
        if self.insecure_join_without_admission:
            self.context.log("insecure_join_without_admission", level="warning",
                             message="insecure_join_without_admission: as a Coordinator this agent lets any node that "
                             "passes attestation join without the admin's admission (safe only on a measured immutable "
                             "image)")

    # -- the admin (AdmitNodes)
    def listed(self) -> List[Dict[str, Any]]:
        """Every admission, sorted by name: ``{ek_pub_sha256, name, joined}``."""
        out = []
        for key, raw in self.context.store.items(KEY_ADMITTED_EK_PREFIX):
            ek = key[len(KEY_ADMITTED_EK_PREFIX):]
            record = _load(raw, ek)
            out.append({"ek_pub_sha256": ek, "name": record["name"], "joined": record.get("vpn_pub_key") is not None})
        return sorted(out, key=lambda a: (a["name"], a["ek_pub_sha256"]))

    def admit_nodes(self, nodes: Any, check: bool = False) -> Dict[str, Any]:
        """Adds (``state`` present, the default) or removes (``state`` absent) admissions, in one transaction.
        ``nodes``: ``[{ek_pub_sha256, name, state}]``. Idempotent; ``check`` only predicts. Returns ``{changed,
        added, removed, renamed (names, sorted), admissions (all, after)}``. A name already admitted for another
        EK is refused (InputError naming ``nodes[i].name``); so is an EK admitted under another name once it
        joined (remove it first: its name is its kubelet name)."""
        method = "AdmitNodes"
        self.context.require_coordinator(method)
        wanted = self._parse(nodes)

        def apply(tx):
            changes: Dict[str, List[str]] = {"added": [], "removed": [], "renamed": []}
            names = {}
            for key, raw in tx.items(KEY_ADMITTED_EK_PREFIX):
                names[_load(raw, key[len(KEY_ADMITTED_EK_PREFIX):])["name"]] = key[len(KEY_ADMITTED_EK_PREFIX):]
            for index, (ek, name, present) in enumerate(wanted):
                key = KEY_ADMITTED_EK_PREFIX + ek
                current = _load(tx.get_default(key), ek)
                if not present:
                    if current is not None:
                        changes["removed"].append(current["name"])
                        names.pop(current["name"], None)
                        if not check:
                            tx.delete(key)
                    continue
                holder = names.get(name)
                if holder is not None and holder != ek:
                    raise InputError("nodes[%d].name" % index, "a name no other admitted EK has",
                                     "%s (admitted for EK %s)" % (name, holder))
                if current is not None and current["name"] == name:
                    continue
                if current is not None and current.get("vpn_pub_key") is not None:
                    raise InputError("nodes[%d].name" % index, "the name EK %s joined under (%s): remove the "
                                     "admission first (state absent) to rename it" % (ek, current["name"]), name)
                changes["renamed" if current is not None else "added"].append(name)
                if current is not None:
                    names.pop(current["name"], None)
                names[name] = ek
                if not check:
                    tx.put(key, _dump({"name": name, "vpn_pub_key": None, "ts": round(time.time(), 3)}))
            return changes

        changes = self.context.store.update(apply)
        changed = any(changes.values())
        if changed and not check:
            self.context.log("nodes_admitted", added=sorted(changes["added"]), removed=sorted(changes["removed"]),
                             renamed=sorted(changes["renamed"]))
        return dict({k: sorted(v) for k, v in changes.items()}, changed=changed, admissions=self.listed())

    @staticmethod
    def _parse(nodes: Any) -> List[tuple]:
        if not isinstance(nodes, list) or len(nodes) > MAX_ADMISSIONS_PER_CALL:
            raise InputError("nodes", "a list of at most %d {ek_pub_sha256, name, state}" % MAX_ADMISSIONS_PER_CALL,
                             type(nodes).__name__)
        wanted, seen = [], set()
        for index, item in enumerate(nodes):
            field = "nodes[%d]" % index
            if not isinstance(item, dict):
                raise InputError(field, "a mapping {ek_pub_sha256, name, state}", type(item).__name__)
            state = item.get("state", "present")
            if state not in ("present", "absent"):
                raise InputError(field + ".state", "present or absent", state if isinstance(state, str) else None)
            ek = parse_ek_pub_sha256(item.get("ek_pub_sha256"), field + ".ek_pub_sha256")
            if ek in seen:
                raise InputError(field + ".ek_pub_sha256", "each EK once per call", ek)
            seen.add(ek)
            name = parse_node_name(item.get("name"), field + ".name") if state == "present" else None
            wanted.append((ek, name, state == "present"))
        return wanted

    # -- the join service
    def claim(self, ek: Optional[str], vpn_pub_key: str, peer: str, method: str) -> Optional[Dict[str, Any]]:
        """The admission of the joining node's EK, bound to its WireGuard key (first use binds; the same key
        again is the same node's retry). ``{name, ek_pub_sha256, bound (this call bound it)}``; None where no
        admission is needed (``insecure_join_without_admission`` and not admitted). AccessDenied (reason
        ``not_admitted``) otherwise, logged as ``join_refused``."""
        if ek is None:
            if self.insecure_join_without_admission:
                return None
            return self._refuse(peer, method, "this node's attestation names no EK (only variant qemu-vtpm-ek proves "
                                "which TPM it is), so no admission can name it: joins need qemu-vtpm-ek, or the "
                                "Coordinator's agent option insecure_join_without_admission", None)
        key = KEY_ADMITTED_EK_PREFIX + ek

        def bind(tx):
            record = _load(tx.get_default(key), ek)
            if record is None:
                return None, False
            holder = record.get("vpn_pub_key")
            if holder is not None and holder != vpn_pub_key:
                return record, False
            if holder is None:
                tx.put(key, _dump(dict(record, vpn_pub_key=vpn_pub_key)))
                return dict(record, vpn_pub_key=vpn_pub_key), True
            return record, False

        record, bound = self.context.store.update(bind)
        if record is None:
            if self.insecure_join_without_admission:
                return None
            return self._refuse(peer, method, "this node's EK (sha256 %s) was not admitted by the admin: %s"
                                % (ek, ADMISSION_HINT), ek)
        if record["vpn_pub_key"] != vpn_pub_key:
            return self._refuse(peer, method, "the admission of this node's EK (sha256 %s, %s) is used by another node "
                                "already (another WireGuard key): a rebooted node rejoins (IssueRejoinTicket); a "
                                "reinstalled one needs its admission removed and added again" % (ek, record["name"]),
                                ek)
        return {"name": record["name"], "ek_pub_sha256": ek, "bound": bound}

    def release(self, claimed: Optional[Dict[str, Any]], vpn_pub_key: str) -> None:
        """A join that failed before the node was recorded gives back the binding it made."""
        if not claimed or not claimed.get("bound"):
            return
        key = KEY_ADMITTED_EK_PREFIX + claimed["ek_pub_sha256"]

        def unbind(tx):
            record = _load(tx.get_default(key), claimed["ek_pub_sha256"])
            if record is not None and record.get("vpn_pub_key") == vpn_pub_key:
                tx.put(key, _dump(dict(record, vpn_pub_key=None)))

        self.context.store.update(unbind)

    def _refuse(self, peer: str, method: str, why: str, ek: Optional[str]) -> None:
        self.context.log("join_refused", level="warning", peer=peer, reason=why[:300], ek_pub_sha256=ek)
        raise AccessDenied("%s: %s" % (method, why)).with_reason(REASON_NOT_ADMITTED)

    def state_fields(self) -> Dict[str, Any]:
        """GetState's details of a Coordinator: how joins are consented to."""
        return {"join_admission": "insecure: any attested node joins (insecure_join_without_admission)"
                if self.insecure_join_without_admission else "admitted EKs only (AdmitNodes)"}


def forget_admission(tx, vpn_pub_key: str) -> None:
    """In one transaction: the admission the peer with WireGuard key ``vpn_pub_key`` joined with (RemovePeer)."""
    for key, raw in tx.items(KEY_ADMITTED_EK_PREFIX):
        if _load(raw, key[len(KEY_ADMITTED_EK_PREFIX):]).get("vpn_pub_key") == vpn_pub_key:
            tx.delete(key)
