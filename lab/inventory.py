# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's inventories: the operator's (hosts reached over the aTLS connection plugin from the admin
machine's namespace, with the image's signed policy and the lab's trust material) and, in the state folder,
a second one that reaches the same hosts with the local connection through a wrapper shell per host."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List

import yaml

from lab import snp, ssh
from lab.names import ADMIN_IP, Host, bridge_netns
from lab.state import LabState
from lab.trust import LabTrust, write_text


def local_inventory_path(state_dir: Path) -> Path:
    return state_dir / "local-inventory.yml"


def _wrapper_shell(h: Host, state_dir: Path) -> Path:
    shell = state_dir / "bin" / ("%s-sh" % h.name)
    # Already inside the host (a shell task run through this wrapper again): /run/netns
    # is hidden by the host's private /run, so recognise the namespace by its inode.
    net_inode = os.stat("/run/netns/%s" % h.netns).st_ino
    shell.write_text("#!/bin/sh\n"
                     "if [ \"$(readlink /proc/self/ns/net)\" = \"net:[%d]\" ]; then exec /bin/sh \"$@\"; fi\n"
                     "exec %s /bin/sh \"$@\"\n" % (net_inode, " ".join(h.nsenter_prefix)))
    shell.chmod(0o755)
    return shell


def write_inventory(inv: Path, lab_name: str, state_dir: Path, state: LabState, hosts: List[Host],
                    coordinators: int, trust: LabTrust, python: List[str]) -> Path:
    """Writes both inventories of the lab; returns ``inv``."""
    inv = Path(inv)
    (inv / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (state_dir / "bin").mkdir(parents=True, exist_ok=True)
    host_vars, local_vars = {}, {}
    for h in hosts:
        shell = _wrapper_shell(h, state_dir)
        host_vars[h.name] = {
            "constellation_public_ip": h.public_ip,
            "constellation_public_endpoint": h.public_endpoint,
            "constellation_tpm_tcti": h.tcti,
            # Where the host's installed agent lives (lab/agent.py's install_dir): upgrade_agent.yml replaces it.
            "node_agent_install_dir": str(h.dir / "install"),
        }
        if state.sshd:  # bare hosts: the node_agent role's folders, TPM and service manager (lab/ssh.py)
            host_vars[h.name].update(ssh.host_vars(h))
        source = snp.report_source(state.variant, h)
        if source is not None:  # an SEV-SNP variant: the host's platform service (lab/snp_platform.py)
            host_vars[h.name]["constellation_snp_report_source"] = source
        local_vars[h.name] = dict(host_vars[h.name], ansible_connection="local",
                                  ansible_shell_executable=str(shell), ansible_python_interpreter=python[0])

    def groups(per_host):
        return {"all": {"children": {
            "coordinators": {"hosts": {h.name: per_host[h.name] for h in hosts[:coordinators]}} if hosts else {},
            "nodes": {"hosts": {h.name: per_host[h.name] for h in hosts[coordinators:]}},
        }}}

    local_inventory = local_inventory_path(state_dir)
    header = "# Written by `python -m lab up` (lab %s); do not edit.\n" % lab_name
    write_text(inv / "hosts.yml", header + yaml.safe_dump(groups(host_vars), sort_keys=False))
    write_text(local_inventory, header + yaml.safe_dump(groups(local_vars), sort_keys=False))
    measurements = snp.measurements(state.image, state.variant)
    write_text(inv / "measurements.json", json.dumps(measurements, indent=2) + "\n")
    # Signed with the lab's key; the inventory pins its public half (every policy load checks it).
    trust.sign_measurements(inv / "measurements.json")
    write_text(inv / "measurements.pub", trust.measurements_pub_path.read_text())
    write_text(inv / "init_secret", trust.init_secret() + "\n", mode=0o600)
    if trust.ek_ca_path.exists():
        write_text(inv / "ek_ca.pem", trust.ek_ca_path.read_text())
    if snp.uses_snp(state.variant):
        write_text(inv / "amd_roots.pem", trust.amd_roots_path.read_text())
    admin_key = trust.admin_key(inv)
    vault_pass = inv / "vault_pass"
    if not vault_pass.exists():
        write_text(vault_pass, os.urandom(24).hex() + "\n", mode=0o600)
    lab_vars = {
        "constellation_lab_name": lab_name,
        "constellation_lab_admin_ip": ADMIN_IP,
        "constellation_lab_tpm_ca_cert": str(trust.ca_dir / "swtpm-localca-rootca-cert.pem"),
        "constellation_attestation_variant": state.variant,
        "constellation_lab_local_inventory": str(local_inventory),
        # kubeadm cannot be installed on lab hosts: the lab runs without Kubernetes, and says so
        # (with Kubernetes on, a host without kubeadm fails the run).
        "constellation_kubernetes": False,
        # The operator's view: every host over aTLS, attested against the image's policy.
        "ansible_connection": "constellation.cluster.atls",
        "ansible_pipelining": True,
        "ansible_python_interpreter": python[0],
        # The signed policy file and the pinned key it must be signed with (measurements_signature).
        "constellation_measurements_file": str(inv / "measurements.json"),
        "constellation_measurements_pub_key_file": str(inv / "measurements.pub"),
        # Its signing key: site.yml's first run lists the running agent in the document (agent_measurement).
        "constellation_measurements_signing_priv_key_file": str(trust.measurements_key_path),
        # The same policy inline, for lab tools and Molecule (the playbooks read the signed file).
        "constellation_lab_measurements": measurements,
        # The lab's init secret (0600): site.yml proves it to the Coordinator, which proves each node's.
        "constellation_init_secret_file": str(inv / "init_secret"),
        "constellation_admin_priv_key_file": str(admin_key),
        # qemu-vtpm-ek: the lab CA is the EK root (a real fleet pins its TPM vendor's CAs).
        "constellation_ek_ca_path": str(inv / "ek_ca.pem"),
        # Lab only: lab addresses exist only in namespaces, so the controller's sockets are
        # opened in the admin machine's namespace (a real controller reaches nodes directly).
        "constellation_atls_netns": bridge_netns(lab_name),
    }
    if state.sshd:  # bare hosts: playbooks/bootstrap.yml reaches them over SSH as root with the lab's key
        lab_vars.update(ssh.inventory_vars(state_dir, lab_name))
    else:  # the lab starts the agents itself (or a test does): bootstrap.yml leaves the hosts alone (no SSH here)
        lab_vars["constellation_bootstrap"] = False
    if snp.uses_snp(state.variant):
        # The SEV-SNP variants: the lab's AMD is the root (a real fleet pins AMD's own, the built-in default).
        lab_vars["constellation_amd_roots_path"] = str(inv / "amd_roots.pem")
    if lab_vars["constellation_attestation_variant"] == "qemu-vtpm":
        # `lab up --variant qemu-vtpm` trusts any AK: the acknowledgement every run then warns about.
        lab_vars["constellation_insecure_trust_any_ak"] = True
    write_text(inv / "group_vars" / "all" / "lab.yml", header + yaml.safe_dump(lab_vars, sort_keys=False))
    return inv
