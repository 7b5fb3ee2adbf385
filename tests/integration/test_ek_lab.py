# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""qemu-vtpm-ek with real agents (swtpm with EK certificates from the lab CA, wireguard-go,
namespaces): every verifier enrolls a peer's AK through its EK certificate chain before it trusts
it. The controller enrolls the Coordinator (EnrollAK), the Coordinator enrolls the Nodes it
activates (EnrollAK) and the Node that joins (in-band, inside IssueJoinTicket), and a TPM whose EK
certificate comes from another CA is refused everywhere with nothing activated.
h1 Coordinator; h2 activated by the Coordinator; h3 joins; h4 and h5 have a foreign TPM."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from lab.agent import start_agent, stop_agent, tail_log
from lab.image import lab_measurements
from lab.lab import Lab
from lab.netns import NetNS
from tests.support.wait import until as wait_until
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurements, expected_pcr15)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import coordinator_policy, fresh_node_policy

pytestmark = pytest.mark.lab

POLICY = Measurements.from_dict(lab_measurements())


@pytest.fixture(scope="module")
def ek_lab():
    lab = Lab("ekl", inventory_dir=None)
    lab.up(hosts=5, tpm=True, variant="qemu-vtpm-ek")
    admin = NetNS(lab.bridge_netns)
    procs = {}
    try:
        for name in ("h4", "h5"):
            lab.foreign_tpm(name)
        for name in ("h1", "h2", "h4"):
            procs[name] = start_agent(lab, lab.host(name))
        yield lab, admin, procs
    finally:
        for proc in procs.values():
            stop_agent(proc)
        admin.close()
        lab.down()


def _trust(lab):
    return choose.load_trust("qemu-vtpm-ek", str(lab.ek_ca_path))


def _connect(lab, admin, name, trust, policy=None):
    host = lab.host(name)
    validators = [choose.validator("qemu-vtpm-ek", policy or coordinator_policy(POLICY), trust)]
    return connect_enrolling(
        lambda v: AgentClient.connect(host.public_endpoint, v, sock=admin.connect((host.public_ip, 9000))), validators)


def test_agents_issue_ek_documents_and_plain_qemu_vtpm_is_not_accepted(ek_lab):
    lab, admin, _procs = ek_lab
    h1 = lab.host("h1")
    with pytest.raises(AttestationError, match="no attestation of an accepted variant"):
        AgentClient.connect(h1.public_endpoint, [choose.validator("qemu-vtpm", POLICY, insecure_trust_any_ak=True)],
                            sock=admin.connect((h1.public_ip, 9000)))


def test_chain_of_trust_with_ek_enrollment_at_every_step(ek_lab):
    lab, admin, procs = ek_lab
    trust = _trust(lab)
    secret, salt = kms.MasterSecret.generate(), os.urandom(32)
    admin_key = ed25519.Ed25519PrivateKey.generate()
    admin_pem = admin_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    with _connect(lab, admin, "h1", trust) as c:
        c.activate_as_coordinator(secret.to_uri(), salt, admin_pem)
    assert len(trust.certified_aks) == 1  # the controller enrolled the Coordinator's AK once
    cluster_id = kms.ClusterKMS(secret).cluster_id(salt)
    # The Coordinator enrolls h2 itself (EnrollAK) before it validates and activates it.
    with _connect(lab, admin, "h1", trust) as c:
        assert len(trust.certified_aks) == 1  # no second enrollment for the same AK
        c.admin_auth(admin_key)
        result = c.activate_additional_nodes([lab.host("h2").public_endpoint, lab.host("h4").public_endpoint])
    rows = {row["node_public_endpoint"]: row for row in result["nodes"]}
    assert rows[lab.host("h2").public_endpoint]["ok"], result
    foreign = rows[lab.host("h4").public_endpoint]
    assert not foreign["ok"] and "EK certificate does not chain to the trusted CAs" in foreign["error"]
    log = tail_log(lab.host("h2"), 200)
    assert '"ak_enrolled"' in log
    # h3 joins: the Coordinator enrolls it in-band, inside IssueJoinTicket - once the admin admitted its EK. Until
    # then it is refused, naming its EK; the controller reads the EK by attesting h3 (as add_nodes.yml does).
    procs["h3"] = start_agent(lab, lab.host("h3"), coordinator_public_endpoint=lab.host("h1").public_endpoint,
                              coordinator_pub_key=kms.coordinator_pub_key(kms.ClusterKMS(secret)))
    h3 = lab.host("h3")
    wait_until(lambda: [line for line in tail_log(lab.host("h1"), 300).splitlines()
                        if "join_refused" in line and "was not admitted by the admin" in line],
               timeout=30.0, what="h3 refused before its admission")
    with _connect(lab, admin, "h3", trust, policy=fresh_node_policy(POLICY)) as c:
        h3_ek = c.attested.validation.ek_pub_sha256
    with _connect(lab, admin, "h1", trust) as c:
        c.admin_auth(admin_key)
        assert c.invoke("AdmitNodes", nodes=[{"ek_pub_sha256": h3_ek, "name": "h3"}])["added"] == ["h3"]

    def h3_vpn_address():
        return h3.run(["ip", "-4", "-o", "addr", "show", "dev", "wg0"], check=False).stdout.strip()

    wait_until(h3_vpn_address, timeout=120.0, what="h3 joins (its agent retries with a backoff)",
               why=lambda: "h3: %s\nh1: %s" % (tail_log(h3, 5), tail_log(lab.host("h1"), 5)))
    assert '"via": "join"' in tail_log(lab.host("h1"), 300)
    # A joining node with a foreign TPM is refused by the join service, before any lock.
    procs["h5"] = start_agent(lab, lab.host("h5"), coordinator_public_endpoint=lab.host("h1").public_endpoint,
                              coordinator_pub_key=kms.coordinator_pub_key(kms.ClusterKMS(secret)))

    def h5_refused():
        return [line for line in tail_log(lab.host("h1"), 300).splitlines()
                if "join_refused" in line and "EK certificate" in line]

    refusal = wait_until(h5_refused, timeout=30.0, what="h5 refused")
    assert "does not chain to the trusted CAs" in refusal[0]
    for name, locked in (("h1", True), ("h2", True), ("h3", True), ("h4", False), ("h5", False)):
        res = lab.host(name).run(["tpm2_pcrread", "-T", lab.host(name).tcti, "sha256:15"],
                                 env=dict(os.environ, TSS2_LOG="all+none"))
        pcr15 = bytes.fromhex(res.stdout.strip().split("0x")[-1].strip())
        assert pcr15 == (expected_pcr15(cluster_id) if locked else bytes(32)), name
