# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Taking a dead Coordinator out of the cluster (docs/store.md, "Replacing a dead Coordinator").

A Coordinator is two things in the cluster's shared state: a voting member of the etcd cluster (its
peer URL on the Coordinator's VPN IP) and a peer entry with the role coordinator in the registry. A dead
one still counts in etcd's majority (three members with one dead keep writing; a second loss stops
them) and stays in every peer's WireGuard mesh and in the Nodes' list of Coordinators to poll.

``remove_coordinator(store, vpn_ip)``, on an ``EtcdStore`` of one live Coordinator's member:

* removes the etcd member first (the majority is then counted among the living), then the peer entry
  in one registry transaction (``PeerRegistry.remove`` also releases the VPN IP, so the next Coordinator
  activated gets it again); the agents follow the registry's version, so the other Coordinators drop
  its WireGuard peer and the Nodes learn the removal with their next update;
* refuses the member the store talks to, the last member, a peer that is not a Coordinator, and a member
  that still answers unless ``force``: a member counts as dead only when none of its client URLs takes
  a TCP connection within ``timeout``; one that takes it but fails etcd's status request is alive enough
  to count (a Coordinator that runs must not be cut off by a bad TLS setting);
* is idempotent: a second run finds nothing and changes nothing; a run interrupted between the two
  steps (member gone, entry left) is finished by the next.

``evict_member(store, vpn_ip, own_vpn_ip)`` is the leader's side of evicting a Coordinator that failed
re-attestation (core/trust.py): the same removal of the member, but refused (held, with the reason) when
the members that remain would not hold a live majority: a tampered member still votes, and removing it
while another member is down would stop the cluster.

``open_local_member(state_dir)`` opens the store on this host's own member, as the agent configured it
(``etcd_member``: data in ``<data_dir>/data``, TLS files in ``<data_dir>/tls``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ansible_collections.constellation.cluster.plugins.module_utils.core import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.core.peers import ROLE_COORDINATOR
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd import EtcdStore

PROBE_TIMEOUT = 2.0
# etcd refuses a membership change for a while after a member (re)connected ("unhealthy cluster").
RECONFIG_WAIT = 30.0
TRANSIENT = ("unhealthy cluster", "leader changed", "no leader")


@dataclass
class LocalMember:
    """This host's etcd member: its VPN IP, the TLS files it serves with, a store on it."""

    vpn_ip: str
    tls: Dict[str, str]
    store: EtcdStore

    def close(self) -> None:
        self.store.close()


def _member_vpn_ip(cert_path: str) -> str:
    """The VPN IP an etcd member certificate (store/etcd_pki.py) is issued for: the IP address SAN that its common
    name, the member name (``coordinator-<VPN IP>``), was made from."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import member_name

    try:
        with open(cert_path, "rb") as handle:
            cert = x509.load_pem_x509_certificate(handle.read())
        addresses = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.IPAddress)
        names = [attr.value for attr in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    except (OSError, ValueError, x509.ExtensionNotFound) as err:
        raise StateError("etcd_data_dir: %s is not an etcd member certificate of this agent: %s" % (cert_path, err)) from None
    matching = [str(a) for a in addresses if [member_name(str(a))] == names]
    if len(matching) != 1:
        raise StateError("etcd_data_dir: %s is not an etcd member certificate of this agent: no address of it "
                         "makes its name %s" % (cert_path, ", ".join(str(n) for n in names) or "(none)"))
    return matching[0]


def open_local_member(state_dir: str, data_dir: Optional[str] = None, client_port: int = 2379,
                      timeout: float = 5, wait: float = 10) -> LocalMember:
    """The agent's own member: the TLS files in ``<data_dir>/tls`` (``data_dir``: ``<state_dir>/etcd``; only a
    Coordinator runs a member), its VPN IP from the member's certificate, the store on ``https://<vpn_ip>:<client_port>``.
    Creates nothing: a missing file is a StateError naming it. A member that does not serve a read is
    asked again for ``wait`` seconds (an election after a member died)."""
    if not isinstance(state_dir, str) or not state_dir:
        raise InputError("agent_state_dir", "the node agent's state directory", state_dir)
    if isinstance(client_port, bool) or not isinstance(client_port, int) or not 1 <= client_port <= 65535:
        raise InputError("etcd_client_port", "a port number between 1 and 65535", client_port)
    data_dir = data_dir or os.path.join(state_dir, "etcd")
    if not os.path.isdir(state_dir):
        raise StateError("agent_state_dir: %s does not exist: no node agent keeps its state there" % state_dir)
    tls_dir = os.path.join(data_dir, "tls")
    tls = {"ca_cert": os.path.join(tls_dir, "ca.pem"), "cert": os.path.join(tls_dir, "member.pem"),
           "key": os.path.join(tls_dir, "member.key")}
    for name, file_path in sorted(tls.items()):
        if not os.path.isfile(file_path):
            raise StateError("etcd_data_dir: %s (the member's %s) does not exist: this Coordinator runs no etcd "
                             "member there (agent config etcd_member.data_dir)" % (file_path, name))
    # The member's VPN IP from its certificate (the agent's store is sealed to the TPM: not read here).
    vpn_ip = _member_vpn_ip(tls["cert"])
    host = vpn_ip if ":" not in vpn_ip else "[%s]" % vpn_ip
    url = "https://%s:%d" % (host, client_port)
    deadline = time.monotonic() + wait
    while True:
        try:
            return LocalMember(vpn_ip, tls, EtcdStore([url], timeout=timeout, tls=tls))
        except StoreError as err:
            # Right after a member died the others elect a leader ("leader changed"): retried, bounded.
            if time.monotonic() >= deadline:
                raise StoreError("etcd_client_port: this Coordinator's etcd member at %s does not serve reads: %s"
                                 % (url, err)) from None
        time.sleep(0.2)


def remove_coordinator(store: EtcdStore, vpn_ip: str, check: bool = False, force: bool = False,
                       tls: Optional[Mapping[str, str]] = None, timeout: float = PROBE_TIMEOUT) -> Dict[str, Any]:
    """Removes (``check``: only reports) the etcd member whose peer URL is on ``vpn_ip`` and the
    registry's Coordinator entry at ``vpn_ip``. ``tls``: the files to ask the member's status with.
    Returns ``{"changed", "vpn_ip", "member", "peer", "health", "members"}``: what was (or would be)
    removed (None: nothing), how the member answered, and the members that remain."""
    ip = check_vpn_ip(vpn_ip)
    endpoints = list(getattr(store, "endpoints", None) or [])
    if len(endpoints) != 1:
        raise InputError("store", "an EtcdStore on one member (open_local_member)", endpoints)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 60:
        raise InputError("timeout", "seconds, more than 0 and at most 60", timeout)
    members = store.member_list()
    target = [m for m in members if any(_url_host(url) == ip for url in m["peer_urls"])]
    if len(target) > 1:
        raise StateError("vpn_ip: %d etcd members have a peer URL on %s (%s): remove them by hand"
                         % (len(target), ip, ", ".join(_member_id(m["id"]) for m in target)))
    member = target[0] if target else None
    registry = state_store.load_peer_registry(store)
    peer = registry.peers.get(ip) if registry is not None else None
    if peer is not None and peer.role != ROLE_COORDINATOR:
        raise InputError("vpn_ip", "the VPN IP of a Coordinator", "%s (a peer with the role %s)" % (ip, peer.role))
    own = _url_key(endpoints[0])
    if ip == _url_host(endpoints[0]) or (member is not None and own in {_url_key(u) for u in member["client_urls"]}):
        raise InputError("vpn_ip", "another Coordinator than this one (its etcd member serves this store)", ip)
    health = None
    if member is not None:
        if len(members) <= 1:
            raise StateError("vpn_ip: %s is the etcd cluster's last member; it cannot be removed" % ip)
        health = probe_member(member, tls, timeout)
        if health["reachable"] and not force:
            raise StateError("vpn_ip: the etcd member %s on %s still answers (%s): a running Coordinator is removed "
                             "only with force" % (member["name"] or _member_id(member["id"]), ip, health["detail"]))
    remaining = [m for m in members if member is None or m["id"] != member["id"]]
    result = {"changed": member is not None or peer is not None, "vpn_ip": ip, "member": _member_view(member),
              "peer": peer.to_dict() if peer is not None else None, "health": health,
              "members": [_member_view(m) for m in remaining]}
    if check or not result["changed"]:
        return result
    if member is not None:
        _remove_member(store, member)
    if peer is not None:
        removed, result["peer_version"] = _retried(lambda: state_store.update_peer_registry(store, _remove_entry(ip)))
        result["peer"] = removed or result["peer"]
    return result


EVICT_PROBE_TIMEOUT = 1.0
EVICT_RECONFIG_WAIT = 10.0


def evict_member(store: EtcdStore, vpn_ip: str, own_vpn_ip: Optional[str], timeout: float = EVICT_PROBE_TIMEOUT,
                 wait: float = EVICT_RECONFIG_WAIT) -> Dict[str, Any]:
    """Removes the etcd member whose peer URL is on ``vpn_ip`` (a Coordinator evicted by the leader at
    ``own_vpn_ip``), unless the members that remain would not hold a live majority: a member counts as live
    when it is the leader's own or takes a TCP connection on a client URL within ``timeout``. Returns
    ``{"removed": member view or None, "held": None or why not, "members": remaining count, "live": count}``.
    A failed removal raises StoreError (the caller holds the eviction and tries again)."""
    ip = check_vpn_ip(vpn_ip)
    if own_vpn_ip is not None and ip == check_vpn_ip(own_vpn_ip):
        raise InputError("vpn_ip", "another Coordinator than the leader itself", ip)
    members = store.member_list()
    target = [m for m in members if any(_url_host(url) == ip for url in m["peer_urls"])]
    if not target:
        return {"removed": None, "held": None, "members": len(members), "live": None}
    remaining = [m for m in members if all(m["id"] != t["id"] for t in target)]
    if not remaining:
        return {"removed": None, "held": "it is the etcd cluster's last member", "members": 0, "live": 0}
    live = 0
    for member in remaining:
        own = own_vpn_ip is not None and any(_url_host(url) == own_vpn_ip for url in member["peer_urls"])
        if own or member_reachable(member, timeout):
            live += 1
    needed = len(remaining) // 2 + 1
    if live < needed:
        return {"removed": None, "members": len(remaining), "live": live,
                "held": "only %d of the %d etcd members that would remain answer (a majority needs %d): removing it "
                        "would stop the cluster's writes; remove the dead members first (remove_coordinator.yml)"
                        % (live, len(remaining), needed)}
    for member in target:
        try:
            EtcdStore.retry(lambda m=member: store.member_remove(m["id"], wait=wait), TRANSIENT, wait)
        except StoreError as err:
            # A removed leader steps down: the answer may time out in the election although the removal
            # was committed (as in _remove_member): only a member still listed is a failure.
            if "member not found" not in str(err) and any(
                    m["id"] == member["id"] for m in EtcdStore.retry(store.member_list, TRANSIENT, wait)):
                raise StoreError("removing the etcd member %s (%s) failed: %s" % (
                    member["name"] or "unnamed", _member_id(member["id"]), err)) from None
    return {"removed": _member_view(target[0]), "held": None, "members": len(remaining), "live": live}


def member_reachable(member: Mapping[str, Any], timeout: float = EVICT_PROBE_TIMEOUT) -> bool:
    """Whether anything takes a TCP connection on one of the member's client URLs within ``timeout``."""
    for url in member.get("client_urls") or ():
        parts = urlsplit(url)
        try:
            with socket.create_connection((parts.hostname, parts.port or 2379), timeout=timeout):
                return True
        except (OSError, ValueError):
            continue
    return False


def probe_member(member: Mapping[str, Any], tls: Optional[Mapping[str, str]] = None,
                 timeout: float = PROBE_TIMEOUT) -> Dict[str, Any]:
    """``{"reachable", "detail"}``: whether anything takes a connection on one of the member's client
    URLs (then etcd's maintenance status says what it is). A member added but never started has none."""
    urls = list(member.get("client_urls") or [])
    if not urls:
        return {"reachable": False, "detail": "it has no client URL (it never started)"}
    failures = []
    for url in urls:
        parts = urlsplit(url)
        try:
            port = parts.port or 2379
            with socket.create_connection((parts.hostname, port), timeout=timeout):
                pass
        except (OSError, ValueError) as err:
            failures.append("%s: %s" % (url, getattr(err, "strerror", None) or str(err) or type(err).__name__))
            continue
        return {"reachable": True, "detail": "%s takes connections; %s" % (url, _status(url, tls, timeout))}
    return {"reachable": False, "detail": "; ".join(failures)}


# --------------------------------------------------------------------------- helpers


def _status(url: str, tls: Optional[Mapping[str, str]], timeout: float) -> str:
    try:
        from etcd3gw.client import Etcd3Client
    except ImportError:
        return "its status was not asked (no etcd3gw)"
    tls = dict(tls or {})
    parts = urlsplit(url)
    client = Etcd3Client(host=parts.hostname, port=parts.port or 2379, protocol=parts.scheme or "http",
                         timeout=timeout, api_path="/v3/", ca_cert=tls.get("ca_cert"), cert_cert=tls.get("cert"),
                         cert_key=tls.get("key"))
    client.session.trust_env = False  # as EtcdStore: not the environment's CA bundle or proxy
    try:
        status = client.status()
        return "etcd %s answers its status (member %s, leader %s)" % (
            status.get("version", "?"), _member_id(status.get("header", {}).get("member_id", 0)),
            _member_id(status.get("leader", 0)))
    except Exception as err:  # pylint: disable=broad-except  # any answer but silence means it runs
        return "its status request failed: %s" % (str(err).strip()[:200] or type(err).__name__)
    finally:
        client.session.close()


def _remove_member(store: EtcdStore, member: Mapping[str, Any]) -> None:
    try:
        _retried(lambda: store.member_remove(member["id"]))
    except StoreError as err:
        if "member not found" in str(err):
            return  # a retry (or another run) after it was removed
        # A removed leader steps down: the request (or member_remove's write after it) may time out
        # in the election although the removal was committed.
        try:
            if all(m["id"] != member["id"] for m in _retried(store.member_list)):
                return
        except StoreError:
            pass
        raise StoreError("removing the etcd member %s (%s) failed: %s (a cluster without a majority cannot change "
                         "its members: docs/store.md)" % (member["name"] or "unnamed", _member_id(member["id"]), err)) \
            from None


def _retried(call):
    """``call()``, again while etcd answers with a transient refusal: a change of members right after
    another ("unhealthy cluster"), an election (a removed leader steps down). Bounded by RECONFIG_WAIT."""
    return EtcdStore.retry(call, TRANSIENT, RECONFIG_WAIT)


def _remove_entry(ip: str):
    def remove(registry) -> Tuple[Optional[Dict[str, Any]], int]:
        record = registry.peers.get(ip)
        if record is None:
            return None, registry.peers.version
        if record.role != ROLE_COORDINATOR:  # changed since it was read: checked again in the transaction
            raise InputError("vpn_ip", "the VPN IP of a Coordinator", "%s (a peer with the role %s)" % (ip, record.role))
        registry.remove(ip)
        return record.to_dict(), registry.peers.version

    return remove


def check_vpn_ip(vpn_ip: Any) -> str:
    try:
        return str(ipaddress.ip_address(vpn_ip))
    except ValueError:
        raise InputError("vpn_ip", "the VPN IP of the dead Coordinator, such as 10.118.0.2", vpn_ip) from None


def _url_host(url: str) -> Optional[str]:
    try:
        return str(ipaddress.ip_address(urlsplit(url).hostname or ""))
    except ValueError:
        return urlsplit(url).hostname


def _url_key(url: str):
    parts = urlsplit(url)
    try:
        return parts.scheme, _url_host(url), parts.port
    except ValueError:
        return parts.scheme, _url_host(url), None


def _member_id(member_id: Any) -> str:
    try:
        return "%016x" % int(member_id)
    except (TypeError, ValueError):
        return str(member_id)


def _member_view(member: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if member is None:
        return None
    return {"id": _member_id(member["id"]), "name": member["name"], "peer_urls": list(member["peer_urls"]),
            "client_urls": list(member["client_urls"])}
