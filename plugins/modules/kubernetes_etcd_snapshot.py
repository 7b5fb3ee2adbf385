#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kubernetes_etcd_snapshot
short_description: Take a snapshot of Kubernetes' etcd on a kubeadm control plane, or write one back for a restore
version_added: "0.3.0"
author: constellation.cluster contributors (@constellation-cluster)
description:
  - Without O(dest), takes a snapshot of the etcd member at O(endpoint) with etcd v3's C(Maintenance.Snapshot)
    through etcd's HTTP/JSON gateway (no C(etcdctl) needed), over TLS with kubeadm's etcd CA pinned and a client
    certificate of it, checks the SHA-256 etcd appends to the snapshot, and returns the snapshot in base64
    (RV(snapshot)) with its size and SHA-256. Nothing is written on the host; the snapshot stays in memory.
  - The snapshot holds every Kubernetes Secret. Run this task with C(no_log) and hand RV(snapshot) only to
    M(constellation.cluster.coordinator_backup), which encrypts it into the backup (C(playbooks/backup.yml)).
  - With O(dest) and O(snapshot), verifies the given snapshot and writes it to O(dest) with mode 0600, atomically,
    for C(etcdutl snapshot restore) (C(playbooks/restore.yml) with C(restore_kubernetes_etcd_snapshot_to)). This
    module does not restore Kubernetes' etcd itself (docs/site.md says how).
options:
  endpoint:
    description: The etcd member, C(host:port) or C(https://host:port) (TLS only).
    type: str
    default: 127.0.0.1:2379
  kubernetes_dir:
    description:
      - kubeadm's folder. The CA is C(pki/etcd/ca.crt); the client certificate C(pki/etcd/healthcheck-client.crt/.key),
        else C(pki/apiserver-etcd-client.crt/.key). O(ca_cert_file), O(cert_file) and O(key_file) replace them.
    type: path
    default: /etc/kubernetes
  ca_cert_file:
    description: The etcd CA's certificate (pinned; no system roots). Given with O(cert_file) and O(key_file).
    type: path
  cert_file:
    description: A client certificate of the etcd CA.
    type: path
  key_file:
    description: The key of O(cert_file).
    type: path
  max_size:
    description: The largest snapshot taken, in bytes (at most 268435456); a larger database is refused before
      anything is transferred.
    type: int
    default: 134217728
  timeout:
    description: Seconds each request to etcd may take.
    type: float
    default: 60
  dest:
    description: Write O(snapshot) to this absolute path (its folder must exist) instead of taking a snapshot.
    type: path
  snapshot:
    description: SECRET. With O(dest), the snapshot to write, in base64 (as RV(snapshot) returns it).
    type: str
attributes:
  check_mode:
    support: full
    description: >-
      Taking a snapshot changes nothing, so check mode takes it too (the backup's prediction needs its digest). With
      O(dest), reports whether the file would change and writes nothing.
  diff_mode:
    support: full
    description: With O(dest), before and after are the file's size, SHA-256 and mode - never its data.
  idempotent:
    support: full
    description: Taking never changes anything; O(dest) holding the same snapshot with mode 0600 is left alone.
notes:
  - The standard library only (C(http.client), C(ssl)); the proxy settings of the environment are not used.
"""

EXAMPLES = r"""
- name: Take a snapshot of Kubernetes' etcd on the first control plane
  constellation.cluster.kubernetes_etcd_snapshot:
  register: kubernetes_etcd
  no_log: true  # the snapshot holds the cluster's Secrets

- name: Write a snapshot (this one, or a backup's from coordinator_restore) for etcdutl snapshot restore
  constellation.cluster.kubernetes_etcd_snapshot:
    dest: /var/lib/etcd-restore.db
    snapshot: "{{ kubernetes_etcd.snapshot }}"
  no_log: true
"""

RETURN = r"""
snapshot:
  description: SECRET. The snapshot in base64 (the bbolt database and its SHA-256, as C(etcdutl snapshot restore) reads it).
  returned: when a snapshot was taken (no O(dest))
  type: str
size:
  description: The snapshot's size in bytes.
  returned: success
  type: int
sha256:
  description: The snapshot's SHA-256 (hex).
  returned: success
  type: str
revision:
  description: etcd's revision when the snapshot was asked for.
  returned: when a snapshot was taken
  type: int
etcd_version:
  description: The etcd member's version.
  returned: when a snapshot was taken
  type: str
endpoint:
  description: The etcd member's URL.
  returned: when a snapshot was taken
  type: str
dest:
  description: The file written.
  returned: with O(dest)
  type: str
"""

import base64
import binascii

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import etcd_snapshot


def _write(module):
    params = module.params
    try:
        data = base64.b64decode(params["snapshot"] or "", validate=True)
    except (binascii.Error, ValueError):
        raise InputError("snapshot", "the snapshot in standard base64", "(not shown)") from None
    result = etcd_snapshot.write(params["dest"], data, check_mode=module.check_mode)
    before = result.pop("before")
    if module._diff:
        result["diff"] = {"before": before or {}, "after": {"size": result["size"], "sha256": result["sha256"], "mode": "0600"}}
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            endpoint=dict(type="str", default=etcd_snapshot.DEFAULT_ENDPOINT),
            kubernetes_dir=dict(type="path", default="/etc/kubernetes"),
            ca_cert_file=dict(type="path"),
            cert_file=dict(type="path"),
            key_file=dict(type="path"),
            max_size=dict(type="int", default=etcd_snapshot.DEFAULT_MAX_SIZE),
            timeout=dict(type="float", default=60),
            dest=dict(type="path"),
            snapshot=dict(type="str", no_log=True),
        ),
        required_together=[("ca_cert_file", "cert_file", "key_file"), ("dest", "snapshot")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["dest"]:
            module.exit_json(**_write(module))
        if params["ca_cert_file"]:
            tls = {"ca_cert": params["ca_cert_file"], "cert": params["cert_file"], "key": params["key_file"]}
        else:
            tls = etcd_snapshot.kubeadm_tls(params["kubernetes_dir"])
        snap = etcd_snapshot.take(params["endpoint"], tls, max_size=params["max_size"], timeout=params["timeout"])
    except ConstellationError as err:
        module.fail_json(msg="%s: %s" % ("dest %s" % params["dest"] if params["dest"] else "Kubernetes etcd snapshot", err))
    module.exit_json(changed=False, snapshot=base64.b64encode(snap.data).decode("ascii"), size=snap.size,
                     sha256=snap.sha256, revision=snap.revision, etcd_version=snap.etcd_version,
                     endpoint=params["endpoint"])


if __name__ == "__main__":
    main()
