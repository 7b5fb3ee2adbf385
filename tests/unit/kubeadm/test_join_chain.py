"""Join arguments inside the chain of trust, attacked over real sockets: a real Core (Coordinator, an
in-memory TPM and store) with its kubeadm provider on a control plane made by the kubeadm TEST DOUBLE,
its vpnapi served on loopback. The VPN is 127.77.0.0/16 here, so each client binds the source address
of the peer it claims to be (on Linux every 127/8 address is local), as the WireGuard tunnel would
give it: a known node, a stranger, an evicted node. Also the join ticket's Kubernetes part."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography import x509

from ansible_collections.constellation.cluster.plugins.module_utils import core as core_mod
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.tests.support.join_chain import Cluster, make_csr


@pytest.fixture
def cluster(tmp_path, initialised, control_plane_dir):
    made = Cluster(tmp_path, control_plane_dir)
    yield made
    made.server.stop()


def test_a_known_node_gets_a_fresh_token_per_request_and_its_kubelet_cert(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    before = set(cluster.tokens())
    csr, _key = make_csr(sans=("worker-0", node_ip))
    with cluster.client(node_ip) as client:
        first = client.get_join_args(certificate_request=csr)
        second = client.get_join_args()
    assert first["token"] != second["token"]
    assert set(cluster.tokens()) - before == {first["token"][:6], second["token"][:6]}
    assert first["node_name"] == "worker-0" and "kubelet_cert" not in second and "control_plane_files" not in first
    cert = x509.load_pem_x509_certificate(first["kubelet_cert"].encode())
    assert cert.subject.rfc4514_string() == "CN=system:node:worker-0,O=system:nodes"
    assert first["discovery_token_ca_cert_hash"].startswith("sha256:")


def test_a_stranger_gets_no_token(cluster):
    cluster.add_node("10.42.0.11")
    before = cluster.tokens()
    with pytest.raises((RemoteError, OSError)) as err:
        with cluster.client("127.77.0.99") as client:  # inside the VPN range, but no peer
            client.get_join_args()
    if isinstance(err.value, RemoteError):
        assert err.value.kind == "AccessDenied" and "127.77.0.99 is not a VPN peer of this cluster" in str(err.value)
    assert cluster.tokens() == before


def test_an_evicted_node_gets_no_token_even_on_an_open_connection(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    before = cluster.tokens()
    with cluster.client(node_ip) as client:
        client.get_update(-1)  # accepted while it is a peer
        cluster.core.peer_trust.evict_peer(node_ip, "failed re-attestation (test)")
        with pytest.raises(RemoteError) as err:
            client.get_join_args()
    assert err.value.kind == "AccessDenied" and "evicted" in str(err.value)
    with pytest.raises((RemoteError, OSError)):
        with cluster.client(node_ip) as client:
            client.get_join_args()
    assert cluster.tokens() == before


def test_a_csr_in_another_nodes_name_gets_nothing(cluster):
    alice, mallory = cluster.add_node("10.42.0.11"), cluster.add_node("10.42.0.12")
    with cluster.client(alice) as client:
        assert client.get_join_args(certificate_request=make_csr("system:node:alice", sans=("alice", alice))[0])
    before = cluster.tokens()
    attacks = [
        (make_csr("system:node:alice", sans=("alice", mallory))[0], "AccessDenied", "node name alice belongs to another node"),
        (make_csr("system:node:control-plane-0", sans=())[0], "AccessDenied", "node name control-plane-0 belongs to another node"),
        (make_csr("system:node:mallory", sans=("mallory", alice))[0], "InputError", "only the node name mallory and its VPN IP"),
        (make_csr("system:node:mallory", orgs=("system:masters",))[0], "InputError", "exactly one organization system:nodes"),
        (make_csr("system:node:mallory", orgs=("system:nodes", "system:masters"))[0], "InputError", "exactly one organization"),
    ]
    with cluster.client(mallory) as client:
        for csr, kind, message in attacks:
            with pytest.raises(RemoteError) as err:
                client.get_join_args(certificate_request=csr)
            assert err.value.kind == kind and message in str(err.value), (kind, message, str(err.value))
    assert cluster.tokens() == before  # not even a token left for mallory
    with cluster.client(alice) as client:  # alice's name stays hers, on her next request too
        assert client.get_join_args(certificate_request=make_csr("system:node:alice", sans=("alice",))[0])["node_name"] == "alice"


def test_a_control_plane_gets_the_pki_files_and_a_certificate_key(cluster):
    node_ip = cluster.add_node("10.42.0.11", control_plane=True)  # designated by the admin at activation
    with cluster.client(node_ip) as client:
        args = client.get_join_args(is_control_plane=True)
        key = client.get_certificate_key()
    names = [f["name"] for f in args["control_plane_files"]]
    assert names == ["ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt", "front-proxy-ca.key",
                     "etcd/ca.crt", "etcd/ca.key"]
    with open(os.path.join(cluster.control_plane_dir, "pki", "ca.key"), "rb") as handle:
        assert base64.b64decode(args["control_plane_files"][1]["data"]) == handle.read()
    assert len(key) == 64


def test_without_a_control_plane_the_answer_says_why(tmp_path, double_log):
    cluster = Cluster(tmp_path, str(tmp_path / "no-control-plane"))
    try:
        node_ip = cluster.add_node("10.42.0.11")
        with cluster.client(node_ip) as client:
            with pytest.raises(RemoteError, match="GetJoinArgs: kubeadm not available on the Coordinator .no control plane"):
                client.get_join_args()
        ticket = cluster.core.join_service.issue_join_ticket(core_mod.new_disk_uuid(), cluster.core.coordinator.reserve_node_ip())
        assert ticket.kubeadm["available"] is False and "kubeadm init has not run" in ticket.kubeadm["reason"]
    finally:
        cluster.server.stop()
    assert double_log.entries() == []


def test_the_join_ticket_carries_a_fresh_token_the_kubelet_cert_and_never_control_plane_files(cluster):
    tickets = []
    for name in ("worker-0", "worker-1"):
        vpn_ip = cluster.core.coordinator.reserve_node_ip()
        ticket = cluster.core.join_service.issue_join_ticket(core_mod.new_disk_uuid(), vpn_ip,
                                                             make_csr("system:node:" + name, sans=())[0])
        tickets.append((vpn_ip, core_mod.JoinTicket.from_dict(ticket.to_dict()).kubeadm))
    (ip0, first), (ip1, second) = tickets
    assert first["available"] is True and first["token"] != second["token"]
    assert set(first) >= {"api_server_endpoint", "token", "discovery_token_ca_cert_hash", "kubelet_cert", "node_name"}
    sans = x509.load_pem_x509_certificate(second["kubelet_cert"].encode()).extensions \
        .get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [ip1]  # the ticket's VPN IP
    assert "control_plane_files" not in first
    # A joining node cannot make itself a control plane: the ticket is refused, no token left.
    before = cluster.tokens()
    with pytest.raises(AccessDenied, match="is_control_plane: a node cannot designate itself a control plane"):
        cluster.core.join_service.issue_join_ticket(core_mod.new_disk_uuid(), cluster.core.coordinator.reserve_node_ip(),
                                                    make_csr("system:node:control-plane-1", sans=())[0], True)
    assert cluster.tokens() == before
    assert ip0 != ip1


def test_a_ticket_with_a_csr_in_another_nodes_name_is_refused(cluster):
    cluster.core.join_service.issue_join_ticket(core_mod.new_disk_uuid(), cluster.core.coordinator.reserve_node_ip(),
                                                make_csr("system:node:worker-0", sans=())[0])
    before = cluster.tokens()
    with pytest.raises(AccessDenied, match="node name worker-0 belongs to another node"):
        cluster.core.join_service.issue_join_ticket(core_mod.new_disk_uuid(), cluster.core.coordinator.reserve_node_ip(),
                                                    make_csr("system:node:worker-0", sans=())[0])
    with pytest.raises(InputError, match="certificate_request"):
        cluster.core.join_service.issue_join_ticket(core_mod.new_disk_uuid(), cluster.core.coordinator.reserve_node_ip(), b"garbage")
    assert cluster.tokens() == before


def test_a_node_gets_a_kubelet_certificate_for_one_name_only(cluster):
    """A Node (activated by an older controller, so no name from the admin) certified as mallory asks
    for kubelet certificates in further names no node holds yet: each is refused, nothing is recorded, no token
    leaves; its own name still works."""
    mallory = cluster.add_node("10.42.0.12")
    with cluster.client(mallory) as client:
        assert client.get_join_args(certificate_request=make_csr("system:node:mallory", sans=())[0])["node_name"] == "mallory"
        before = cluster.tokens()
        for name in ("mallory-2", "worker-7", "control-plane-1"):
            with pytest.raises(RemoteError) as err:
                client.get_join_args(certificate_request=make_csr("system:node:" + name, sans=())[0])
            assert err.value.kind == "AccessDenied" and "is not this node's name: it is named mallory" in str(err.value)
        assert cluster.tokens() == before
        assert client.get_join_args(certificate_request=make_csr("system:node:mallory", sans=())[0])["node_name"] == "mallory"
    assert cluster.core.kubernetes.kubernetes_node_names(mallory) == ["mallory"]


def test_a_node_cannot_take_the_name_the_admin_gave_another_node(cluster):
    """The admin named bob at his activation (his inventory name); bob has not asked for his certificate yet.
    Mallory (no name from the admin) asks for bob's name first: refused, and bob gets his later. A node the admin
    named gets no other name."""
    bob = cluster.add_node("10.42.0.11", name="bob")
    mallory = cluster.add_node("10.42.0.12")
    alice = cluster.add_node("10.42.0.13", name="alice")
    with cluster.client(mallory) as client:
        with pytest.raises(RemoteError) as err:
            client.get_join_args(certificate_request=make_csr("system:node:bob", sans=())[0])
    assert err.value.kind == "AccessDenied" and "node name bob belongs to another node (%s)" % bob in str(err.value)
    with cluster.client(alice) as client:
        with pytest.raises(RemoteError) as err:
            client.get_join_args(certificate_request=make_csr("system:node:alice-2", sans=())[0])
    assert err.value.kind == "AccessDenied" and "is not this node's name: it is named alice" in str(err.value)
    with cluster.client(bob) as client:
        assert client.get_join_args(certificate_request=make_csr("system:node:bob", sans=())[0])["node_name"] == "bob"
    with pytest.raises(AccessDenied, match="node name bob belongs to another node"):  # no re-naming onto bob
        cluster.core.kubernetes.name_node(mallory, "bob", "ActivateAdditionalNodes")


def test_the_vpnapi_without_a_provider_says_so(tmp_path, initialised, control_plane_dir):
    cluster = Cluster(tmp_path, control_plane_dir, provider=False)
    try:
        node_ip = cluster.add_node("10.42.0.11")
        with cluster.client(node_ip) as client:
            with pytest.raises(RemoteError, match="GetJoinArgs: kubeadm not available on the Coordinator") as err:
                client.get_join_args()
        assert err.value.kind == "StateError"
    finally:
        cluster.server.stop()
