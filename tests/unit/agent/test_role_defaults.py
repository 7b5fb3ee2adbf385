# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node_agent role's defaults as Ansible renders them (secure by default): the agent
configuration it writes for a host, checked with the agent's own loader as the role's first task does
(filter agent_config_error). By default: variant qemu-vtpm-ek with the controller's EK CA file, this
host's init secret hash derived from the cluster's init secret, the verification service on the public
IP (the public endpoint binds 0.0.0.0); without an init secret the role's check names the variable."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import init_secret_hash

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files:
    - {repo}/roles/node_agent/defaults/main.yml
    - {repo}/roles/node_agent/vars/main.yml
  vars:
    role_path: {repo}/roles/node_agent
  tasks:
    - ansible.builtin.copy:
        dest: "{{{{ out }}}}"
        content: "{{{{ {{'config': node_agent_config,
                       'error': node_agent_config | constellation.cluster.agent_config_error(node_agent_config_names)}}
                     | to_json }}}}"
    - ansible.builtin.copy:
        dest: "{{{{ out }}}}.packages"
        content: "{{{{ node_agent_all_packages | to_json }}}}"
"""


def render(tmp_path, **extra):
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(repo=REPO))
    out = tmp_path / "out.json"
    args = [os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play),
            "-e", json.dumps(dict({"out": str(out), "constellation_public_ip": "192.0.2.10",
                                   "ansible_python_interpreter": sys.executable}, **extra))]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


@pytest.fixture
def pub_key_file(tmp_path):
    """The controller's pinned measurements key (constellation_measurements_pub_key_file)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "measurements.pub"
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(path)


@pytest.fixture
def ek_ca_file(tmp_path):
    from ansible_collections.constellation.cluster.tests.support.ek_vendor import Vendor, pem

    vendor = Vendor("Vendor A")
    path = tmp_path / "ek_ca.pem"
    path.write_bytes(pem(vendor.root, vendor.inter))
    return str(path)


def test_the_role_defaults_are_secure(tmp_path, ek_ca_file, pub_key_file):
    secret = base64.b64encode(os.urandom(32)).decode()
    (tmp_path / "init_secret").write_text(secret + "\n")
    result = render(tmp_path, constellation_init_secret_file=str(tmp_path / "init_secret"),
                    constellation_ek_ca_path=ek_ca_file, constellation_measurements_pub_key_file=pub_key_file,
                    node_agent_measurements={"4": {"expected": "aa" * 32}})
    config = result["config"]
    assert config["variant"] == "qemu-vtpm-ek" and config["ek_ca"].endswith("/ek_ca.pem")
    assert config["init_secret_hash"] == init_secret_hash(secret, "192.0.2.10")
    assert not [key for key in config if key.startswith("insecure")], config
    # The controller's pinned measurements key is pinned on the agent; the deployment mode is said.
    assert config["measurements_pub_key"].endswith("/measurements.pub") and config["deployment_mode"] == "host"
    assert config["public_endpoint"] == "0.0.0.0:9000"
    assert (config["verify_grpc_endpoint"], config["verify_http_endpoint"]) == ("192.0.2.10:9090", "192.0.2.10:8080")
    assert result["error"] == ""


def test_without_a_pinned_measurements_key_the_role_check_names_the_variable(tmp_path, ek_ca_file):
    secret = base64.b64encode(os.urandom(32)).decode()
    (tmp_path / "init_secret").write_text(secret + "\n")
    base = dict(constellation_init_secret_file=str(tmp_path / "init_secret"), constellation_ek_ca_path=ek_ca_file,
                node_agent_measurements={"4": {"expected": "aa" * 32}})
    result = render(tmp_path, **base)
    assert "measurements_pub_key" not in result["config"]
    assert result["error"].startswith("node_agent_measurements_pub_key: expected the pinned measurements public key")
    assert "insecure_unsigned_measurements: true" in result["error"]
    result = render(tmp_path, node_agent_insecure_unsigned_measurements=True, **base)  # the explicit opt-out
    assert result["error"] == "" and result["config"]["insecure_unsigned_measurements"] is True


def test_without_an_init_secret_the_role_check_names_the_variable(tmp_path, ek_ca_file, pub_key_file):
    result = render(tmp_path, constellation_ek_ca_path=ek_ca_file, constellation_measurements_pub_key_file=pub_key_file,
                    node_agent_measurements={"4": {"expected": "aa" * 32}})
    assert "init_secret_hash" not in result["config"]
    assert result["error"].startswith("node_agent_init_secret_hash")
    assert "insecure_unauthenticated_activation: true" in result["error"]
    # The explicit opt-out, and qemu-vtpm with its acknowledgement: accepted, and written so the agent warns.
    result = render(tmp_path, node_agent_insecure_unauthenticated_activation=True,
                    constellation_attestation_variant="qemu-vtpm", constellation_insecure_trust_any_ak=True,
                    constellation_measurements_pub_key_file=pub_key_file,
                    node_agent_measurements={"4": {"expected": "aa" * 32}})
    assert result["error"] == ""
    assert result["config"]["insecure_unauthenticated_activation"] is True
    assert result["config"]["insecure_trust_any_ak"] is True and result["config"]["variant"] == "qemu-vtpm"


def test_qemu_vtpm_without_the_acknowledgement_is_refused_naming_the_role_variable(tmp_path):
    result = render(tmp_path, node_agent_insecure_unauthenticated_activation=True, node_agent_variant="qemu-vtpm",
                    node_agent_measurements={"4": {"expected": "aa" * 32}})
    assert result["error"].startswith("node_agent_insecure_trust_any_ak: expected true to use variant qemu-vtpm")


def test_the_state_disk_device_reaches_the_agent_config_with_its_packages(tmp_path, ek_ca_file, pub_key_file):
    """The state disk device: empty by default (no key, no cryptsetup); set, it is in the config and cryptsetup-bin installed."""
    base = dict(constellation_ek_ca_path=ek_ca_file, node_agent_measurements={"4": {"expected": "aa" * 32}},
                constellation_measurements_pub_key_file=pub_key_file,
                node_agent_insecure_unauthenticated_activation=True)
    result = render(tmp_path, **base)
    assert "state_disk_device" not in result["config"]
    assert "cryptsetup-bin" not in json.loads((tmp_path / "out.json.packages").read_text())
    result = render(tmp_path, node_agent_state_disk_device="/dev/vdb", **base)
    assert result["config"]["state_disk_device"] == "/dev/vdb" and result["error"] == ""
    assert "cryptsetup-bin" in json.loads((tmp_path / "out.json.packages").read_text())
    result = render(tmp_path, node_agent_state_disk_device="vdb", **base)
    assert result["error"].startswith("node_agent_state_disk_device: expected the absolute path")


def test_the_role_refuses_the_image_mode_which_only_the_image_build_sets(tmp_path):
    """node_agent installs onto an ordinary host: deployment_mode image (the measured node image, whose boot chain
    measures the agent) is refused before anything is installed, naming the variable and why."""
    play = tmp_path / "role.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: %s/roles/node_agent\n" % REPO)
    args = [os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
            str(play), "-e", json.dumps({"node_agent_deployment_mode": "image", "constellation_public_ip": "192.0.2.10",
                                         "ansible_python_interpreter": sys.executable})]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert "node_agent_deployment_mode: expected host" in out and "got image" in out
    assert "set only by the node image''s build" in out or "set only by the node image's build" in out
    assert "changed=0" in out
