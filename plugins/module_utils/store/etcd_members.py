# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The members of a Coordinators' etcd cluster, as etcd sees them (docs/store.md, "Replacing a dead
Coordinator"): this host's own member (``open_local_member``: data in ``<data_dir>/data``, TLS files in
``<data_dir>/tls``), whether a member is alive (``member_reachable``, ``probe_member``: dead only when none
of its client URLs takes a TCP connection), removing one (``remove_member``, retried while etcd calls the
cluster unhealthy) and the views the module reports. Taking a Coordinator out of the cluster (member and
registry entry) is the Core's: ``core/coordinator_removal.py``."""


from __future__ import annotations

import ipaddress
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional
from urllib.parse import urlsplit

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd import EtcdStore

PROBE_TIMEOUT = 2.0
# etcd refuses a membership change for a while after a member (re)connected ("unhealthy cluster").
RECONFIG_WAIT = 30.0
TRANSIENT = ("unhealthy cluster", "leader changed", "no leader")
EVICT_PROBE_TIMEOUT = 1.0


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
            status.get("version", "?"), member_id_hex(status.get("header", {}).get("member_id", 0)),
            member_id_hex(status.get("leader", 0)))
    except Exception as err:  # pylint: disable=broad-except  # any answer but silence means it runs
        return "its status request failed: %s" % (str(err).strip()[:200] or type(err).__name__)
    finally:
        client.session.close()


def remove_member(store: EtcdStore, member: Mapping[str, Any]) -> None:
    try:
        retried(lambda: store.member_remove(member["id"]))
    except StoreError as err:
        if "member not found" in str(err):
            return  # a retry (or another run) after it was removed
        # A removed leader steps down: the request (or member_remove's write after it) may time out
        # in the election although the removal was committed.
        try:
            if all(m["id"] != member["id"] for m in retried(store.member_list)):
                return
        except StoreError:
            pass
        raise StoreError("removing the etcd member %s (%s) failed: %s (a cluster without a majority cannot change "
                         "its members: docs/store.md)" % (member["name"] or "unnamed", member_id_hex(member["id"]), err)) \
            from None


def retried(call):
    """``call()``, again while etcd answers with a transient refusal: a change of members right after
    another ("unhealthy cluster"), an election (a removed leader steps down). Bounded by RECONFIG_WAIT."""
    return EtcdStore.retry(call, TRANSIENT, RECONFIG_WAIT)


def check_vpn_ip(vpn_ip: Any) -> str:
    try:
        return str(ipaddress.ip_address(vpn_ip))
    except ValueError:
        raise InputError("vpn_ip", "the VPN IP of the dead Coordinator, such as 10.118.0.2", vpn_ip) from None


def url_host(url: str) -> Optional[str]:
    try:
        return str(ipaddress.ip_address(urlsplit(url).hostname or ""))
    except ValueError:
        return urlsplit(url).hostname


def url_key(url: str):
    parts = urlsplit(url)
    try:
        return parts.scheme, url_host(url), parts.port
    except ValueError:
        return parts.scheme, url_host(url), None


def member_id_hex(member_id: Any) -> str:
    try:
        return "%016x" % int(member_id)
    except (TypeError, ValueError):
        return str(member_id)


def member_view(member: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if member is None:
        return None
    return {"id": member_id_hex(member["id"]), "name": member["name"], "peer_urls": list(member["peer_urls"]),
            "client_urls": list(member["client_urls"])}
