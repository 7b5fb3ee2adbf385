"""The pod network's settings, the conflist and the nftables table rendered from them, and the steps a host needs
(plugins/module_utils/pod_network: conflist.py, nft.py, network.py ``changes``)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network import (
    dump_conflist,
    parse_conflist,
    parse_pod_network_spec,
    render_conflist,
    render_table,
)
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.network import (
    BridgeState,
    PodNetworkState,
    changes,
)
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.nft import normalize, replace_script

SPEC = parse_pod_network_spec(pod_cidr="10.244.1.0/24")

# The table as nft 1.0.6 (Debian 12) lists it once applied: counters, blank lines, set elements in its own order.
LISTED = """table inet constellation_pod_network {
\tchain forward {
\t\ttype filter hook forward priority filter; policy accept;
\t\tip daddr 10.244.0.0/16 oifname != { "lo", "wg0", "cni0" } counter packets 0 bytes 0 drop comment "pod range only via wg0"
\t}

\tchain output {
\t\ttype filter hook output priority filter; policy accept;
\t\tip daddr 10.244.0.0/16 oifname != { "lo", "wg0", "cni0" } counter packets 3 bytes 252 drop comment "pod range only via wg0"
\t}

\tchain postrouting {
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tip saddr 10.244.1.0/24 ip daddr != { 10.118.0.0/16, 10.244.0.0/16 } counter packets 0 bytes 0 masquerade comment "pod egress"
\t}
}
"""


def test_defaults_and_the_conflist():
    assert SPEC.to_dict() == {"cluster_pod_cidr": "10.244.0.0/16", "pod_cidr": "10.244.1.0/24",
                              "vpn_cidr": "10.118.0.0/16", "mtu": 1420, "masquerade": True}
    assert SPEC.gateway == "10.244.1.1" and SPEC.bridge_address == "10.244.1.1/24"
    doc = render_conflist(SPEC)
    assert (doc["cniVersion"], doc["name"]) == ("1.0.0", "constellation")
    assert [p["type"] for p in doc["plugins"]] == ["bridge", "portmap", "loopback"]
    bridge = doc["plugins"][0]
    assert (bridge["bridge"], bridge["isGateway"], bridge["hairpinMode"], bridge["ipMasq"], bridge["mtu"]) == \
        ("cni0", True, True, False, 1420)
    assert bridge["ipam"] == {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24", "gateway": "10.244.1.1"}]],
                              "routes": [{"dst": "0.0.0.0/0"}]}
    assert doc["plugins"][1] == {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}
    data = dump_conflist(doc)
    assert data.endswith(b"\n") and json.loads(data) == doc and dump_conflist(render_conflist(SPEC)) == data
    assert parse_conflist(data) == doc


def test_a_smaller_node_cidr_and_mtu_change_only_their_fields():
    spec = parse_pod_network_spec("10.32.0.0/12", "10.33.4.0/26", mtu=1380)
    doc = render_conflist(spec)
    assert doc["plugins"][0]["mtu"] == 1380
    assert doc["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.33.4.0/26", "gateway": "10.33.4.1"}]]


@pytest.mark.parametrize("kwargs, field, expected", [
    (dict(pod_cidr=None), "pod_cidr", "IPv4 network"),
    (dict(pod_cidr="10.244.1.1/24"), "pod_cidr", "no host bits"),
    (dict(pod_cidr="10.245.1.0/24"), "pod_cidr", "inside cluster_pod_cidr 10.244.0.0/16"),
    (dict(pod_cidr="10.244.1.0/31"), "pod_cidr", "at least 4 addresses"),
    (dict(pod_cidr="fd00::/64"), "pod_cidr", "IPv4"),
    (dict(cluster_pod_cidr="10.118.0.0/15", pod_cidr="10.118.1.0/24"), "cluster_pod_cidr", "VPN CIDR 10.118.0.0/16"),
    (dict(cluster_pod_cidr="10.96.0.0/12", pod_cidr="10.96.1.0/24", service_cidr="10.96.0.0/12"), "cluster_pod_cidr",
     "service CIDR"),
    (dict(pod_cidr="10.244.1.0/24", service_cidr="nope"), "service_cidr", "IPv4 network"),
    (dict(pod_cidr="10.244.1.0/24", vpn_cidr="10.118.0.0/33"), "vpn_cidr", "IPv4 network"),
    (dict(pod_cidr="10.244.1.0/24", mtu=True), "mtu", "576 to 9000"),
    (dict(pod_cidr="10.244.1.0/24", mtu="1420"), "mtu", "576 to 9000"),
    (dict(pod_cidr="10.244.1.0/24", mtu=100), "mtu", "576 to 9000"),
    (dict(pod_cidr="10.244.1.0/24", masquerade="yes"), "masquerade", "a boolean"),
])
def test_bad_settings_name_the_field(kwargs, field, expected):
    with pytest.raises(InputError) as err:
        parse_pod_network_spec(**kwargs)
    assert err.value.field == field and expected in str(err.value)


@pytest.mark.parametrize("data, field", [
    (b"{", "conflist"),
    (b"[]", "conflist"),
    (b'{"cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]}', "conflist.name"),
    (b'{"name": "x", "cniVersion": "1.0.0", "plugins": []}', "conflist.plugins"),
    (b'{"name": "x", "cniVersion": "1.0.0", "plugins": [{"type": "../bin/sh"}]}', "conflist.plugins[0].type"),
    (b'{"name": "x", "cniVersion": "1.0.0", "plugins": ["bridge"]}', "conflist.plugins[0].type"),
])
def test_a_bad_conflist_names_its_field(data, field):
    with pytest.raises(InputError) as err:
        parse_conflist(data)
    assert err.value.field == field


def test_the_table_drops_pod_range_traffic_off_wg0_and_masquerades_pod_egress():
    table = render_table(SPEC)
    rule = 'ip daddr 10.244.0.0/16 oifname != { "wg0", "cni0", "lo" } counter drop'
    assert table.count(rule) == 2
    assert "chain forward {" in table and "chain output {" in table
    assert "ip saddr 10.244.1.0/24 ip daddr != { 10.244.0.0/16, 10.118.0.0/16 } counter masquerade" in table
    off = render_table(parse_pod_network_spec(pod_cidr="10.244.1.0/24", masquerade=False))
    assert "masquerade" not in off and "postrouting" not in off and off.count(rule) == 2
    script = replace_script(table)
    assert script.startswith("table inet constellation_pod_network\ndelete table inet constellation_pod_network\n")
    assert script.endswith(table)


def test_the_live_listing_matches_the_rendering_whatever_its_counters_and_set_order():
    assert normalize(LISTED) == normalize(render_table(SPEC))
    assert normalize(LISTED) != normalize(render_table(parse_pod_network_spec(pod_cidr="10.244.2.0/24")))
    assert normalize(LISTED.replace('"lo", ', "")) != normalize(render_table(SPEC))
    assert normalize(None) == [] and normalize("") == []


def _state(**kwargs):
    base = dict(conflist=dump_conflist(render_conflist(SPEC)), conflist_mode=0o644, table=LISTED,
                bridge=BridgeState(True, "bridge", True, 1420, ("10.244.1.1/24",)), ip_forward=True)
    base.update(kwargs)
    return PodNetworkState(**base)


def test_changes_lists_only_what_differs_in_order():
    assert changes(SPEC, _state(), table_differs=False) == []
    assert changes(SPEC, _state(conflist=None, conflist_mode=None, table=None, bridge=BridgeState(False),
                                ip_forward=False, bridge_nf=False), table_differs=True) == \
        ["ip_forward", "bridge_nf_call_iptables", "nftables", "bridge", "bridge_mtu", "bridge_address", "bridge_up",
         "conflist"]
    assert changes(SPEC, _state(bridge_nf=None), table_differs=False) == []  # no br_netfilter: left to kubeadm
    assert changes(SPEC, _state(conflist_mode=0o600), table_differs=False) == ["conflist"]
    assert changes(SPEC, _state(bridge=BridgeState(True, "bridge", False, 1500, ("10.244.9.1/24",))),
                   table_differs=False) == ["bridge_mtu", "bridge_address", "bridge_up"]
    moved = parse_pod_network_spec(pod_cidr="10.244.2.0/24")
    assert changes(moved, _state(), table_differs=True) == ["nftables", "bridge_address", "conflist"]
