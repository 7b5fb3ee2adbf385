#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kms_key
short_description: Derive a key from a Constellation cluster KMS on the host that holds it
version_added: "0.1.0"
description:
  - Derives a key as Constellation's KeyService does, HKDF-SHA256 of the master secret with info
    C(key-) + key ID, on the host that holds the KMS URI or the master secret file.
  - Writes the key to O(dest) (mode 0600, atomically) and/or returns it, but returns it only when the task
    itself has C(no_log=true), so the key cannot end up in the output.
  - Only the cluster KMS (C(kms://cluster-kms)) can derive keys here; AWS, Azure and GCP URIs are
    validated and then refused with a clear error.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the host the module runs on (HKDF-SHA256)
options:
  kms_uri:
    description:
      - The C(kms://cluster-kms?key=...&salt=...) URI. Mutually exclusive with O(master_secret_file).
    type: str
  master_secret_file:
    description:
      - Path on the host of a C(constellation-mastersecret.json) file (with the fields C(key) and C(salt), both base64).
      - Mutually exclusive with O(kms_uri).
      - The old name C(master_secret_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [master_secret_path]
  key_id:
    description:
      - The key ID without the C(key-) prefix, for example C(measurementSecret) or C(ca_emergency_ssh).
        Case-sensitive. Mutually exclusive with O(state_disk_uuid).
    type: str
  state_disk_uuid:
    description:
      - The LUKS2 UUID of a state disk; the key is the disk's passphrase. The UUID is lower-cased before
        derivation, as Constellation does. Mutually exclusive with O(key_id).
      - The old name C(disk_uuid) is deprecated and will be removed in 2.0.0.
    type: str
    aliases: [disk_uuid]
  length:
    description: Key length in bytes (1 to 8160). A state disk key is always 32 bytes.
    type: int
    default: 32
  dest:
    description:
      - Write the key to this file with mode 0600 (temporary file, fsync, rename).
      - The file is rewritten only when its content or mode differ.
    type: path
  format:
    description: How the key is written to O(dest) and returned in RV(key).
    type: str
    choices: [raw, hex, base64]
    default: raw
  return_key:
    description:
      - Return the key (as hex when O(format=raw)) in RV(key). Requires C(no_log=true) on the task.
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: The diff shows file metadata (exists, mode, size, whether the content matches), never the key.
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second run reports no change.
    support: full
notes:
  - Either O(dest) or O(return_key=true) is needed; otherwise the derived key would go nowhere.
  - The file is owned by the user the module runs as.
seealso:
  - plugin: constellation.cluster.derive_key
    plugin_type: filter
"""

EXAMPLES = r"""
- name: Write the state disk passphrase of a node
  constellation.cluster.kms_key:
    master_secret_file: /etc/constellation/constellation-mastersecret.json
    state_disk_uuid: 5b1f6c8e-3c5a-4e0b-9d0a-2f6e8c7b1a24
    dest: /run/cryptsetup-keys.d/state.key

- name: Get the measurement secret into a variable
  constellation.cluster.kms_key:
    kms_uri: "{{ lookup('ansible.builtin.file', inventory_dir ~ '/constellation-mastersecret.json') | constellation.cluster.kms_uri }}"
    key_id: measurementSecret
    return_key: true
  no_log: true
  register: measurement_secret
"""

RETURN = r"""
key_id:
  description: The key ID used, without the C(key-) prefix (for a disk, the lower-cased UUID).
  returned: always
  type: str
  sample: measurementSecret
length:
  description: Key length in bytes.
  returned: always
  type: int
  sample: 32
dest:
  description: The file written.
  returned: when O(dest) is set
  type: str
  sample: /run/cryptsetup-keys.d/state.key
key:
  description: The key, in O(format) (hex for C(raw)).
  returned: when O(return_key=true)
  type: str
  sample: 4790578891f3fe6cc22cb661ecdc1b7e33121b1287546a52ba33a9136719c213
"""

import base64

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.constellation.cluster.plugins.module_utils.constants import deprecated_alias
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kms import (
    ClusterKMS,
    MasterSecret,
    derive_key,
    open_kms,
    secret_file_state,
    state_disk_key_id,
    write_secret_file,
    HAS_CRYPTOGRAPHY,
    STATE_DISK_KEY_LENGTH,
)


def _encode(key, fmt):
    if fmt == "hex":
        return key.hex().encode()
    if fmt == "base64":
        return base64.b64encode(key)
    return key


def _describe(state):
    if not state.get("exists"):
        return "path: %s\nexists: false\n" % state["path"]
    return "path: %s\nexists: true\nmode: '%s'\nsize: %s\ncontent: %s\n" % (
        state["path"], state["mode"], state["size"],
        "matches" if state.get("content_matches") else "differs")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kms_uri=dict(type="str", no_log=True),
            # Renamed (docs/names.md: one suffix for files, one name per value); the old names work until 2.0.0.
            master_secret_file=dict(type="path", aliases=["master_secret_path"],
                                    deprecated_aliases=[deprecated_alias("master_secret_path")]),
            key_id=dict(type="str"),
            state_disk_uuid=dict(type="str", aliases=["disk_uuid"], deprecated_aliases=[deprecated_alias("disk_uuid")]),
            length=dict(type="int", default=32),
            dest=dict(type="path"),
            format=dict(type="str", choices=["raw", "hex", "base64"], default="raw"),
            return_key=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("kms_uri", "master_secret_file"), ("key_id", "state_disk_uuid")],
        required_one_of=[("kms_uri", "master_secret_file"), ("key_id", "state_disk_uuid")],
        supports_check_mode=True,
    )
    if not HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib("cryptography"))
    p = module.params
    if p["return_key"] and not module.no_log:
        module.fail_json(msg="return_key: expected the task to have no_log: true, so the key cannot "
                             "appear in the output")
    if not p["dest"] and not p["return_key"]:
        module.fail_json(msg="dest: expected a file to write the key to, or return_key: true")
    try:
        if p["kms_uri"] is not None:
            kms = open_kms(p["kms_uri"], "kms_uri")
        else:
            kms = ClusterKMS(MasterSecret.from_file(p["master_secret_file"]))
        if p["state_disk_uuid"] is not None:
            if p["length"] != STATE_DISK_KEY_LENGTH:
                module.fail_json(msg="length: expected %d for a state disk key (or leave it out), got %d"
                                     % (STATE_DISK_KEY_LENGTH, p["length"]))
            key_id = state_disk_key_id(p["state_disk_uuid"])
            length = STATE_DISK_KEY_LENGTH
        else:
            key_id = p["key_id"]
            length = p["length"]
        key = derive_key(kms, key_id, length)
        result = dict(changed=False, key_id=key_id, length=length)
        if p["dest"]:
            data = _encode(key, p["format"])
            before = secret_file_state(p["dest"], data)
            up_to_date = before.get("exists") and before["content_matches"] and before["mode_matches"]
            result["dest"] = p["dest"]
            if not up_to_date:
                result["changed"] = True
                after = dict(path=p["dest"], exists=True, mode="0600", size=len(data), content_matches=True)
                if module._diff:
                    result["diff"] = dict(before_header=p["dest"], after_header=p["dest"],
                                          before=_describe(before), after=_describe(after))
                if not module.check_mode:
                    write_secret_file(p["dest"], data)
        if p["return_key"]:
            result["key"] = key.hex() if p["format"] == "raw" else _encode(key, p["format"]).decode()
    except (ConstellationError, OSError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
