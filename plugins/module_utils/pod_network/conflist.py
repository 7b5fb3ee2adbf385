# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pod network's settings and the CNI configuration list a node's kubelet (and the lab's pods) use.

``PodNetworkSpec`` is what one node wants: the cluster's pod range, the node's own pod CIDR (handed out by the
Coordinator, carried in the signed peer sets), the VPN CIDR, the MTU and whether pod egress is masqueraded.
``parse_pod_network_spec`` checks it and names the field of any bad value. ``render_conflist`` turns it into the
conflist ``/etc/cni/net.d/10-constellation.conflist`` (network ``constellation``): ``bridge`` (``cni0``, the
gateway, hairpin mode, no masquerading: pod addresses are kept across nodes) with ``host-local`` IPAM over the
node's pod CIDR, ``portmap`` (hostPort, with SNAT) and ``loopback``, all from Debian's containernetworking-plugins.
``parse_conflist`` checks any conflist a runtime is handed (cni.py).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any, Mapping

from ansible_collections.constellation.cluster.plugins.module_utils.constants import CLUSTER_POD_CIDR
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.keys import MTU, VPN_CIDR

NETWORK_NAME = "constellation"
CONF_DIR = "/etc/cni/net.d"
CONFLIST_NAME = "10-constellation.conflist"
CONFLIST_PATH = "%s/%s" % (CONF_DIR, CONFLIST_NAME)
CONFLIST_MODE = 0o644
CNI_VERSION = "1.0.0"
BRIDGE = "cni0"
# The plugins the conflist names, in chain order (bridge delegates its IPAM to host-local).
PLUGINS = ("bridge", "host-local", "portmap", "loopback")
# An IPv4 packet needs 68 bytes (RFC 791); above 9000 no underlay carries it.
MTU_RANGE = (576, 9000)


@dataclass(frozen=True)
class PodNetworkSpec:
    """One node's pod network, validated (``parse_pod_network_spec``)."""

    pod_cidr: str
    cluster_pod_cidr: str = CLUSTER_POD_CIDR
    vpn_cidr: str = VPN_CIDR
    mtu: int = MTU
    masquerade: bool = True

    @property
    def gateway(self) -> str:
        """The node's address on ``cni0``: the first host address of its pod CIDR (the pods' default route)."""
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    @property
    def bridge_address(self) -> str:
        return "%s/%d" % (self.gateway, ipaddress.ip_network(self.pod_cidr).prefixlen)

    def to_dict(self) -> dict:
        return {"cluster_pod_cidr": self.cluster_pod_cidr, "pod_cidr": self.pod_cidr, "vpn_cidr": self.vpn_cidr,
                "mtu": self.mtu, "masquerade": self.masquerade}


def _network(value: Any, field: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(value if isinstance(value, str) else "", strict=True)
    except ValueError:
        raise InputError(field, "an IPv4 network in CIDR notation with no host bits set, e.g. 10.244.0.0/16",
                         value) from None
    if net.version != 4:
        raise InputError(field, "an IPv4 network (the pod network is IPv4 only)", value)
    return net


def parse_pod_network_spec(cluster_pod_cidr: Any = CLUSTER_POD_CIDR, pod_cidr: Any = None, vpn_cidr: Any = VPN_CIDR,
                           mtu: Any = MTU, masquerade: Any = True, service_cidr: Any = None) -> PodNetworkSpec:
    """Checks every value before anything is touched; the error names the option, what it got and what it needs:
    ``pod_cidr`` inside ``cluster_pod_cidr`` with room for a gateway and a pod, the cluster's range overlapping
    neither the VPN CIDR nor (when given) the service CIDR."""
    cluster = _network(cluster_pod_cidr, "cluster_pod_cidr")
    vpn = _network(vpn_cidr, "vpn_cidr")
    if cluster.overlaps(vpn):
        raise InputError("cluster_pod_cidr", "a range that does not overlap the VPN CIDR %s" % vpn, cluster_pod_cidr)
    if service_cidr is not None:
        service = _network(service_cidr, "service_cidr")
        if cluster.overlaps(service):
            raise InputError("cluster_pod_cidr", "a range that does not overlap the service CIDR %s" % service,
                             cluster_pod_cidr)
    own = _network(pod_cidr, "pod_cidr")
    if not own.subnet_of(cluster):
        raise InputError("pod_cidr", "a network inside cluster_pod_cidr %s" % cluster, pod_cidr)
    if own.num_addresses < 4:
        raise InputError("pod_cidr", "a network of at least 4 addresses (/30: a gateway and a pod)", pod_cidr)
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]:
        raise InputError("mtu", "an integer from %d to %d (wg0's MTU: 1420 on a 1500 underlay)" % MTU_RANGE, mtu)
    if not isinstance(masquerade, bool):
        raise InputError("masquerade", "a boolean", masquerade)
    return PodNetworkSpec(pod_cidr=str(own), cluster_pod_cidr=str(cluster), vpn_cidr=str(vpn), mtu=mtu,
                          masquerade=masquerade)


def render_conflist(spec: PodNetworkSpec) -> dict:
    """The conflist as a document (``dump_conflist`` gives its bytes)."""
    return {
        "cniVersion": CNI_VERSION,
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "hairpinMode": True,
                "ipMasq": False,
                "mtu": spec.mtu,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": spec.pod_cidr, "gateway": spec.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            {"type": "loopback"},
        ],
    }


def dump_conflist(doc: Mapping) -> bytes:
    """The bytes written to the conflist file: stable key order as rendered, two-space indent, a final newline."""
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def parse_conflist(data: Any, field: str = "conflist") -> dict:
    """A CNI configuration list (bytes, text or a parsed document) checked for what a runtime needs: ``name``,
    ``cniVersion`` and a non-empty ``plugins`` list whose entries each name a plugin ``type`` (a file name)."""
    doc = data
    if isinstance(data, (bytes, str)):
        try:
            doc = json.loads(data)
        except ValueError as err:
            raise InputError(field, "a CNI configuration list in JSON (%s)" % err) from None
    if not isinstance(doc, dict):
        raise InputError(field, "a JSON object with name, cniVersion and plugins", type(doc).__name__)
    for key in ("name", "cniVersion"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise InputError("%s.%s" % (field, key), "a non-empty string", doc.get(key))
    plugins = doc.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise InputError("%s.plugins" % field, "a non-empty list of plugin configurations", plugins)
    for i, plugin in enumerate(plugins):
        kind = plugin.get("type") if isinstance(plugin, dict) else None
        if not isinstance(kind, str) or not kind or "/" in kind or kind in (".", ".."):
            raise InputError("%s.plugins[%d].type" % (field, i), "the file name of a CNI plugin", kind)
    return doc
