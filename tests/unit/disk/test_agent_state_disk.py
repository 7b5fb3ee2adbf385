"""The agent's state disk (disk/attach.py) with a Core: the first activation formats the disk with the node's disk
UUID and moves the store onto it; a restart opens it with the key at rest before the store is read; a disk of
another node is refused; without state_disk_device GetState says the state is not on an encrypted disk. The real
cryptsetup on a file; open, mkfs and mount through the recording test double (no device-mapper here)."""

from __future__ import annotations

import os
import shutil

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig, require_dm_crypt
from ansible_collections.constellation.cluster.plugins.module_utils.disk.attach import AgentStateDisk
from ansible_collections.constellation.cluster.plugins.module_utils.disk.luks import Cryptsetup
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import NOT_ENCRYPTED, StateDisk
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateDiskError
from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN
from ansible_collections.constellation.cluster.tests.unit.disk.disk_fakes import FAST, OTHER_UUID, UUID, RecordingRunner

needs_cryptsetup = pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="cryptsetup is missing")
BASE = {"state_dir": "/nonexistent", "public_endpoint": "10.0.0.1:9000", "variant": "dummy",
        "insecure_unauthenticated_activation": True}  # these tests are about other keys


def admin_pem() -> str:
    key = ed25519.Ed25519PrivateKey.generate()
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class Node:
    """What the agent wires (agent/wiring.py): a FileStore in the state directory, the StateDisk, the Core."""

    def __init__(self, tmp_path, image, tpm, disk_uuid=None):
        self.state_dir = str(tmp_path / "state")
        os.makedirs(self.state_dir, exist_ok=True)
        self.store = FileStore(os.path.join(self.state_dir, "store.json"))
        self.runner = RecordingRunner(real=True)
        self.events = []
        disk = StateDisk(image, "test-state", os.path.join(self.state_dir, "disk"), runner=self.runner,
                         integrity=False, params=FAST)
        self.port = AgentStateDisk(disk, self.store, log=lambda event, **fields: self.events.append((event, fields)))
        uuid = self.port.header_uuid() or disk_uuid or core.new_disk_uuid()
        self.core = core.Core(self.store, tpm, RecordingVPN(), self.state_dir, "10.42.0.10", uuid)
        self.port.read_key = self.core.context.read_disk_key
        self.core.context.state_disk = self.port


@needs_cryptsetup
def test_first_activation_formats_the_disk_with_the_disk_uuid_and_a_restart_opens_it(tmp_path, image):
    tpm, secret = MemoryTPM(), kms.MasterSecret.generate()
    node = Node(tmp_path, image, tpm)
    node.port.at_boot()  # no header: the store stays in the state directory
    assert node.core.recovery.load() == core.State.ACCEPTING_INIT
    node.core.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem())
    # The LUKS UUID is the disk UUID the Coordinator derives the disk key for; the key opens it.
    assert Cryptsetup().luks_uuid(image) == node.core.context.disk_uuid
    assert Cryptsetup().check_key(image, kms.ClusterKMS(secret).state_disk_key(node.core.context.disk_uuid))
    disk_store = os.path.join(node.state_dir, "disk", "store.json")
    assert node.store.path == disk_store and os.path.exists(disk_store)
    assert not os.path.exists(os.path.join(node.state_dir, "store.json"))  # moved, not copied
    assert ("state_disk_open", {"device": image, "mount_dir": os.path.join(node.state_dir, "disk"),
                                "formatted": True, "store_moved": True}) in node.events
    programs = node.runner.programs()
    assert programs.index("cryptsetup luksFormat") < programs.index("mkfs.ext4") < programs.index("mount")
    state = node.core.get_state()["state_disk"]
    assert state["device"] == image and state["luks_uuid"] == node.core.context.disk_uuid

    # Agent restart: the disk UUID from the header, the disk opened with the key at rest before the store is read.
    again = Node(tmp_path, image, tpm)
    assert again.core.context.disk_uuid == node.core.context.disk_uuid
    assert again.store.path != disk_store
    assert again.port.at_boot() is True
    assert again.store.path == disk_store
    assert "cryptsetup luksFormat" not in again.runner.programs()
    assert again.core.recovery.load() == core.State.ACTIVATING_NODES


@needs_cryptsetup
def test_the_disk_of_another_node_fails_the_activation_naming_both_uuids(tmp_path, image):
    Cryptsetup().format(image, bytes(32), OTHER_UUID, integrity=False, params=FAST)
    node = Node(tmp_path, image, MemoryTPM())
    node.core.context.disk_uuid = UUID  # as if its disk_uuid file named another disk
    node.core.recovery.load()
    with pytest.raises(StateDiskError) as err:
        node.core.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem())
    assert OTHER_UUID in str(err.value) and UUID in str(err.value)
    assert node.store.path == os.path.join(node.state_dir, "store.json")


@needs_cryptsetup
def test_a_formatted_disk_without_a_key_at_rest_is_refused_at_boot(tmp_path, image):
    Cryptsetup().format(image, bytes(32), OTHER_UUID, integrity=False, params=FAST)
    node = Node(tmp_path, image, MemoryTPM())
    with pytest.raises(StateDiskError, match="no disk key at rest"):
        node.port.at_boot()


@needs_cryptsetup
def test_an_activated_node_without_its_disk_sets_it_up_at_start(tmp_path, image):
    tpm, secret = MemoryTPM(), kms.MasterSecret.generate()
    node = Node(tmp_path, image, tpm)
    node.core.context.state_disk = None  # activated before state_disk_device was configured
    node.core.recovery.load()
    node.core.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem())
    assert not Cryptsetup().is_luks(image)
    again = Node(tmp_path, image, tpm, disk_uuid=node.core.context.disk_uuid)
    assert again.port.at_boot() is False
    assert again.core.recovery.load() == core.State.ACTIVATING_NODES
    again.port.after_load(bool(again.core.context.node_state), again.core.context.disk_uuid)
    assert Cryptsetup().luks_uuid(image) == node.core.context.disk_uuid
    assert again.store.path == os.path.join(again.state_dir, "disk", "store.json")


def test_without_a_state_disk_get_state_says_so(tmp_path):
    c = core.Core(FileStore(str(tmp_path / "store.json")), MemoryTPM(), RecordingVPN(), str(tmp_path), "10.42.0.10",
                  core.new_disk_uuid())
    c.recovery.load()
    answer = c.get_state()["state_disk"]
    assert answer == NOT_ENCRYPTED and answer["encrypted"] is False
    assert answer["message"] == "the state is not on an encrypted disk (no state_disk_device is configured)"
    assert "state_disk" not in c.status.public_state()  # a detail: after AdminAuth only


# --------------------------------------------------------------------------- the configuration


def test_the_state_disk_keys_and_their_defaults():
    config = AgentConfig.from_mapping(dict(BASE, state_disk_device="/dev/vdb"))
    assert config.state_disk_device == "/dev/vdb" and config.state_disk_mapper_name == "constellation-state"
    assert AgentConfig.from_mapping(BASE).state_disk_device is None


@pytest.mark.parametrize("key,value", [("state_disk_device", "vdb"), ("state_disk_device", 3),
                                       ("state_disk_mapper_name", "a/b"), ("state_disk_mapper_name", "")])
def test_bad_state_disk_values_are_refused_naming_the_key(key, value):
    with pytest.raises(InputError) as err:
        AgentConfig.from_mapping(dict(BASE, **{key: value}))
    assert err.value.field == key


def test_a_store_setting_with_a_state_disk_is_refused():
    with pytest.raises(InputError, match="^store: expected no store setting with state_disk_device"):
        AgentConfig.from_mapping(dict(BASE, state_disk_device="/dev/vdb", store={"type": "memory"}))


def test_the_agent_refuses_a_state_disk_without_dm_crypt_naming_the_key():
    config = AgentConfig.from_mapping(dict(BASE, state_disk_device="/dev/vdb"))
    reason = "no device-mapper in this kernel: /dev/mapper/control missing"
    with pytest.raises(InputError) as err:
        require_dm_crypt(config, available=lambda: (False, reason))
    assert err.value.field == "state_disk_device" and reason in str(err.value) and "/dev/vdb" in str(err.value)
    require_dm_crypt(config, available=lambda: (True, "device-mapper is available"))
    require_dm_crypt(AgentConfig.from_mapping(BASE), available=lambda: (False, reason))  # no disk: no check


def test_the_agent_itself_refuses_to_start_without_dm_crypt(tmp_path):
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import build_agent
    from ansible_collections.constellation.cluster.plugins.module_utils.disk.luks import dm_crypt_available

    usable, _reason = dm_crypt_available()
    if usable:
        pytest.skip("this kernel has device-mapper: the refusal cannot happen here")
    config = AgentConfig.from_mapping(dict(BASE, state_dir=str(tmp_path / "state"), state_disk_device="/dev/vdb"))
    with pytest.raises(InputError) as err:
        build_agent(config)
    assert err.value.field == "state_disk_device" and "no device-mapper in this kernel" in str(err.value)
