#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: agent_state
short_description: Attest a node agent from the controller and read its state
version_added: "0.1.0"
description:
  - Attests the peer's aTLS endpoint against the measurements policy, then asks C(GetState). Read-only.
  - Before authentication a peer answers only its state and role; with O(admin_priv_key_file) also its details.
  - Reports from the attested PCR 15 whether the peer is fresh, locked to this cluster (O(cluster_id)) or to another.
  - When the host's connection is C(constellation.cluster.atls) and the peer is activated, the connection's relay is
    started in the background for the tasks that follow (the connection's option C(prestart)); nothing else is sent.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  endpoint:
    description: The agent's public endpoint, C(host:port).
    type: str
    required: true
  cluster_id:
    description: This cluster's ID (standard base64, 32 bytes), to tell V(ours) from V(other) in RV(membership).
    type: str
  admin_priv_key_file:
    description:
      - The admin's private key. C(GetState) tells anyone only the state and role; with this key the action
        authenticates (C(AdminAuth)) to an activated peer on the same attested connection and also reads its
        VPN IP and key (RV(vpn_ip), RV(vpn_pub_key)), a Coordinator's evicted and unverified peers (RV(evicted),
        RV(unverified)) and its etcd member.
      - Without it (or on a peer that does not accept the key) those are V(null) / empty.
      - It may be an Ansible Vault file (decrypted in memory with the play's vault secrets, never written
        decrypted) or passphrase-protected (the passphrase from the variable C(constellation_admin_key_passphrase),
        kept in Ansible Vault); C(playbooks/secrets.yml) makes it vault-encrypted.
    type: path
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes.
  idempotent:
    support: full
    description: Always C(changed=false).
"""

EXAMPLES = r"""
- name: Attest a peer and read its state
  constellation.cluster.agent_state:
    endpoint: "{{ constellation_public_endpoint }}"
    measurements_file: "{{ constellation_measurements_file }}"
    admin_priv_key_file: "{{ constellation_admin_priv_key_file }}"
    ek_ca_path: "{{ constellation_ek_ca_path }}"
  register: peer
"""

RETURN = r"""
state:
  description: The agent's state (AcceptingInit, ActivatingNodes, NodeWaitingForClusterJoin, IsNode, Failed).
  returned: success
  type: str
  sample: IsNode
role:
  description: V(unknown), V(coordinator) or V(node).
  returned: success
  type: str
membership:
  description: From the attested PCR 15, V(fresh) (never locked), V(ours) (this O(cluster_id)) or V(other).
  returned: success
  type: str
pcr15:
  description: The attested PCR 15 (hex).
  returned: success
  type: str
endpoint:
  description: The endpoint attested.
  returned: success
  type: str
pcrs:
  description: The per-PCR table of the policy (index, expected, found, warn_only, ok); on refusal the refused table.
  returned: always
  type: list
  elements: dict
vpn_ip:
  description: The peer's VPN IP (only with O(admin_priv_key_file), once activated).
  returned: success
  type: str
vpn_pub_key:
  description: The peer's WireGuard public key (only with O(admin_priv_key_file), once activated).
  returned: success
  type: str
node_pod_cidr:
  description:
    - The peer's own pod CIDR (only with O(admin_priv_key_file), once activated; none without the pod network).
      Every other peer's WireGuard holds it next to the peer's VPN IP (docs/wireguard.md).
  returned: success
  type: str
  sample: 10.244.1.0/24
  version_added: "0.5.0"
cluster_pod_cidr:
  description: The cluster's pod range, routed into C(wg0) on the peer (only with O(admin_priv_key_file), once activated).
  returned: success
  type: str
  sample: 10.244.0.0/16
  version_added: "0.5.0"
evicted:
  description: An activated Coordinator's evicted peers (only with O(admin_priv_key_file)).
  returned: success
  type: list
  elements: dict
unverified:
  description:
    - An activated Coordinator's unverified Nodes (only with O(admin_priv_key_file)) - not re-attested for
      C(reattest_unreachable_limit) rounds in a row; they get no new secret until a re-attestation passes, and
      are evicted after C(unverified_eviction_after) seconds. Each has C(vpn_ip), C(public_ip), C(since) (epoch
      seconds of its first unreachable round) and C(error).
  returned: success
  type: list
  elements: dict
removed:
  description: The Nodes the admin removed from an activated Coordinator's cluster (remove_node.yml; only with
    O(admin_priv_key_file)).
  returned: success
  type: list
  elements: dict
etcd_member:
  description:
    - V(running) or V(stopped) for an activated Coordinator that shares the cluster's state with other Coordinators
      in etcd (its agent runs an etcd member); V(null) otherwise.
    - V(stopped) means the cluster runs with one member less until the agent has started it again.
  returned: success
  type: str
  sample: running
state_disk:
  description:
    - Whether the peer's state is on its encrypted state disk (only with O(admin_priv_key_file), once activated).
    - C(encrypted) is V(false) when the agent has no C(state_disk_device), or its disk is not open yet; C(message)
      says which in a sentence.
  returned: success
  type: dict
  sample: {"encrypted": true, "device": "/dev/vdb", "luks_uuid": "0f3e1c2a-1111-4222-8333-444455556666",
           "open": true, "message": "the state is on the encrypted disk /dev/vdb (LUKS2, opened with the disk key)"}
agent_measurement:
  description:
    - What the peer's agent extended into PCR 13 before it served anything (only with O(admin_priv_key_file), once
      activated) - the SHA-256 of its code and of its trust configuration, in this order; C(value) is PCR 13 after
      both, and the C(pcrs) row of index 13 shows whether it is the value this collection expects.
    - Not returned for an agent in the node image (C(deployment_mode) V(image)); it extends nothing into PCR 13, which
      its set enforces at 32 zero bytes; the image's boot chain (PCRs 4, 9, 11) covers its code and configuration.
  returned: success
  type: dict
  sample: {"pcr": 13, "value": "b0d08c7a...", "events": [{"event": "agent_code", "digest": "e5a27ba1..."},
           {"event": "agent_config", "digest": "503bdfce..."}]}
secrets_at_rest:
  description:
    - Whether the peer's secrets at rest (its store, its state disk key) are encrypted with a key sealed to its TPM,
      and to which PCRs (only with O(admin_priv_key_file), once activated).
  returned: success
  type: dict
  sample: {"sealed": true, "pcrs": [4, 9, 11]}
peer_resource_version:
  description:
    - The version of the peer set a Node applied (it refuses an older one) or a Coordinator holds (only with
      O(admin_priv_key_file), once activated). restore.yml compares the newest backup with the Nodes' versions.
  returned: success
  type: int
deployment_mode:
  description:
    - How the peer's agent is deployed (only with O(admin_priv_key_file)); V(host) is an agent on an ordinary host
      (the node_agent role), V(image) the agent inside the measured node image (docs/security.md, "Deployment
      modes").
  returned: success
  type: str
  sample: host
host_root_trusted:
  description:
    - V(true) when the host's root is trusted on the peer (only with O(admin_priv_key_file)); in mode V(host) nothing
      before userspace measures the agent, so root can replay its PCR 13 and read the peer's secrets in a genuine
      boot. Warned about on every run. V(false) in mode V(image) - no login, and its boot chain measured what runs.
  returned: success
  type: bool
  sample: true
snp:
  description:
    - For a peer of an SEV-SNP variant, its report as verified (AMD's field names, bytes as lower-case hex, the TCBs as
      bootloader, tee, snp and microcode) with C(product) and C(signing_key); verify.yml shows its reported TCB and
      launch measurement. V(null) for a TPM variant.
  returned: success
  type: dict
  sample: {"measurement": "6a063be9dd79f6371c842e480f8dc3b5c725961344e57130e88c5adf49e8f7f6c79b75a5eb77fc769959f4aeb2d9401e",
           "reported_tcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115}, "product": "Milan", "signing_key": "vcek"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import AGENT_STATE_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "agent_state", **attested_options(AGENT_STATE_ARGS))


if __name__ == "__main__":
    main()
