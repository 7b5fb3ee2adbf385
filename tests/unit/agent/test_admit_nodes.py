# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AdmitNodes (docs/security.md, "Consent to a join") on the real admin channel of a Coordinator on loopback:
only the admin, only on an activated Coordinator; check mode changes nothing; idempotent; bad input names the
field. RemovePeer deletes the admission the removed node joined with. The controller reads an EK certificate file."""

from __future__ import annotations

import datetime
import hashlib
import os

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.plugin_utils.admission import admission_ek
from ansible_collections.constellation.cluster.tests.support.admin_channel import _connect, keypair
from ansible_collections.constellation.cluster.tests.support.core_fakes import FakeJoinChannel, MemoryTPM, admitted_issuer, pubapi_server
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator

EK_A, EK_B = "a" * 64, "b" * 64


def test_admit_nodes_only_for_the_admin_on_an_activated_coordinator(make_core):
    fresh, _vpn = make_core(MemoryTPM(), public_ip="127.0.0.1")
    fresh.recovery.load()
    admit = {"nodes": [{"ek_pub_sha256": EK_A, "name": "worker-a"}]}
    with pubapi_server(fresh) as server:
        endpoint = "127.0.0.1:%d" % server.address[1]
        with _connect(endpoint) as client:
            with pytest.raises(RemoteError, match="only after activation") as err:
                client.invoke("AdmitNodes", **admit)
            assert err.value.kind == "StateError"
        admin_key, admin_pem = keypair()
        fresh.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem)
        with _connect(endpoint) as client:  # no admin key; then another key: nothing admitted
            with pytest.raises(RemoteError, match="AdminAuth first") as err:
                client.invoke("AdmitNodes", **admit)
            assert err.value.kind == "AccessDenied"
            with pytest.raises(RemoteError):
                client.admin_auth(keypair()[0])
            with pytest.raises(RemoteError, match="AdminAuth first"):
                client.invoke("AdmitNodes", **admit)
        assert fresh.admissions.listed() == []
        with _connect(endpoint) as client:
            client.admin_auth(admin_key)
            predicted = client.invoke("AdmitNodes", check=True, **admit)
            assert predicted["changed"] is True and predicted["added"] == ["worker-a"]
            assert fresh.admissions.listed() == []  # check mode: nothing stored
            assert client.invoke("AdmitNodes", **admit)["admissions"] == [
                {"ek_pub_sha256": EK_A, "name": "worker-a", "joined": False}]
            again = client.invoke("AdmitNodes", **admit)
            assert again["changed"] is False and again["added"] == []
            for nodes, field in (([{"ek_pub_sha256": "zz", "name": "w"}], "nodes[0].ek_pub_sha256"),
                                 ([{"ek_pub_sha256": EK_B, "name": "worker-a"}], "nodes[0].name"),
                                 ([{"ek_pub_sha256": EK_B, "name": "Worker B"}], "nodes[0].name"),
                                 ([{"ek_pub_sha256": EK_B, "name": "b", "state": "gone"}], "nodes[0].state")):
                with pytest.raises(RemoteError) as err:
                    client.invoke("AdmitNodes", nodes=nodes)
                assert err.value.kind == "InputError" and str(err.value).startswith(field), str(err.value)
            removed = client.invoke("AdmitNodes", nodes=[{"ek_pub_sha256": EK_A, "state": "absent"}])
            assert removed["changed"] is True and removed["removed"] == ["worker-a"] and removed["admissions"] == []


def test_a_node_refuses_admit_nodes(make_core):
    node, _vpn = make_core(MemoryTPM())
    node.recovery.load()
    with pytest.raises(core.StateError, match="AdmitNodes"):
        node.admissions.admit_nodes([{"ek_pub_sha256": EK_A, "name": "worker-a"}])


def test_remove_peer_deletes_the_admission_the_node_joined_with(make_core):
    coord, _vpn = make_core(MemoryTPM())
    coord.recovery.load()
    coord.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), keypair()[1])
    issuer = admitted_issuer(coord, "worker-j")
    pub, disk_uuid = os.urandom(32), core.new_disk_uuid()
    channel = FakeJoinChannel(issuer, lambda ticket, binding: None)
    channel.node_vpn_pub_key, channel.disk_uuid = pub, disk_uuid
    answer = coord.join_service.serve_join(disk_uuid, pub, channel, DummyValidator())
    assert coord.admissions.listed()[0]["joined"] is True
    assert coord.kubernetes.kubernetes_node_names(answer["node_vpn_ip"]) == ["worker-j"]
    coord.removal.remove_node(vpn_ip=answer["node_vpn_ip"])
    assert coord.admissions.listed() == []  # it joins again only if the admin admits it again
    assert coord.kubernetes.kubernetes_node_names(answer["node_vpn_ip"]) == []


def test_the_controller_reads_an_ek_certificate_file(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ek")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()) \
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1)) \
        .sign(key, hashes.SHA256())
    expected = hashlib.sha256(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()
    for encoding in (serialization.Encoding.PEM, serialization.Encoding.DER):
        path = tmp_path / "ek.crt"
        path.write_bytes(cert.public_bytes(encoding))
        assert admission_ek({"name": "w", "ek_cert_file": str(path)}, None, 0) == expected
    (tmp_path / "bad.crt").write_bytes(b"not a certificate")
    with pytest.raises(InputError, match=r"^nodes\[2\]\.ek_cert_file: expected an X\.509 EK certificate"):
        admission_ek({"name": "w", "ek_cert_file": str(tmp_path / "bad.crt")}, None, 2)
    with pytest.raises(InputError, match=r"^nodes\[0\]: expected one of ek_pub_sha256, ek_cert_file or endpoint"):
        admission_ek({"name": "w"}, None, 0)
