#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: measurements_signature
short_description: Sign a measurements file, or verify its signature, as cosign sign-blob does
version_added: "0.3.0"
description:
  - Measurements policies are taken on trust only when signed (docs/attestation.md, "Signed measurements"). A signature here is the detached form
    C(cosign sign-blob --key) prints for an ECDSA P-256 key - standard base64 of the ASN.1 DER ECDSA signature over
    SHA-256 of the file's exact bytes - in C(<path>.sig); C(cosign verify-blob --key cosign.pub --signature FILE.sig
    FILE --insecure-ignore-tlog) accepts it, and this module accepts cosign's.
  - V(state=signed) signs O(path) with O(priv_key_file) unless C(<path>.sig) already verifies against that key's
    public half (idempotent - ECDSA signatures are randomised, so an existing valid one is kept).
  - V(state=verified) only checks C(<path>.sig) against O(pub_key_file) and fails, naming the file, when the file
    is unsigned or altered or was signed with another key. Every policy loader of the collection (the attestation
    actions, the atls connection, the agent) makes the same check when a public key is pinned.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography where the module runs (usually the controller, with C(delegate_to=localhost))
options:
  path:
    description: The measurements file.
    type: path
    required: true
  state:
    description: V(signed) makes (or keeps) the signature; V(verified) checks it.
    type: str
    choices: [signed, verified]
    default: verified
  priv_key_file:
    description:
      - V(state=signed) - the ECDSA P-256 private key (PEM, PKCS#8 or SEC1). cosign's own encrypted key format is not
        read; export the key to PEM or sign with cosign.
      - The old name C(private_key_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [private_key_path]
  priv_key_passphrase:
    description:
      - The passphrase of an encrypted PEM private key.
      - The old name C(private_key_passphrase) is deprecated and will be removed in 2.0.0.
    type: str
    aliases: [private_key_passphrase]
  pub_key_file:
    description:
      - The pinned public key (PEM SubjectPublicKeyInfo, as C(cosign.pub)). Required for V(state=verified); with
        V(state=signed) it must be the private key's public half (a guard against signing with the wrong key).
      - The old name C(public_key_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [public_key_path]
attributes:
  check_mode:
    support: full
    description: Reports whether a signature would be written; writes nothing.
  diff_mode:
    support: none
    description: The signature file's content is not shown.
  idempotent:
    support: full
    description: A valid signature is kept.
"""

EXAMPLES = r"""
- name: Sign the policy with the release key (on the controller)
  constellation.cluster.measurements_signature:
    path: "{{ inventory_dir }}/measurements.json"
    state: signed
    priv_key_file: "{{ lookup('ansible.builtin.env', 'HOME') }}/keys/measurements.key"
  delegate_to: localhost

- name: Verify it against the pinned key
  constellation.cluster.measurements_signature:
    path: "{{ inventory_dir }}/measurements.json"
    pub_key_file: "{{ inventory_dir }}/measurements.pub"
  delegate_to: localhost
"""

RETURN = r"""
signature_file:
  description: Where the detached signature is, C(<path>.sig).
  returned: always
  type: str
signature_path:
  description: The same as RV(signature_file); deprecated (its old name), will be removed in 2.0.0.
  returned: always
  type: str
signature:
  description: The signature (standard base64 of DER ECDSA), as in the file; public.
  returned: success
  type: str
verified:
  description: Whether the signature verifies against the (pinned or derived) public key.
  returned: success
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.constants import deprecated_alias
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError


def _run(module):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature as sig

    params = module.params
    path = params["path"]
    sig_path = sig.signature_path(path)
    result = {"changed": False, "signature_file": sig_path, "signature_path": sig_path}
    pinned = sig.load_public_key_file(params["pub_key_file"], "pub_key_file") if params["pub_key_file"] else None
    if params["state"] == "verified":
        if pinned is None:
            module.fail_json(msg="pub_key_file: expected the pinned public key (state=verified)", **result)
        sig.read_signed_file(path, pinned)
        with open(sig_path, "rb") as handle:
            result.update(verified=True, signature=handle.read().decode("ascii", "replace").strip())
        return result
    if not params["priv_key_file"]:
        module.fail_json(msg="priv_key_file: expected the signing key (state=signed)", **result)
    key = sig.load_private_key_file(params["priv_key_file"], "priv_key_file", params["priv_key_passphrase"])
    own = key.public_key()
    if pinned is not None and not sig.same_public_key(pinned, own):
        module.fail_json(msg="priv_key_file: the key is not the one pub_key_file pins", **result)
    if os.path.exists(sig_path):
        try:
            sig.read_signed_file(path, own)
        except ConstellationError:
            pass
        else:
            with open(sig_path, "rb") as handle:
                result.update(verified=True, signature=handle.read().decode("ascii", "replace").strip())
            return result
    with open(path, "rb") as handle:
        signature = sig.sign_blob(key, handle.read())
    result.update(changed=True, verified=True, signature=signature)
    if not module.check_mode:
        tmp = sig_path + ".tmp"
        with open(tmp, "w", encoding="ascii") as handle:
            handle.write(signature + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, sig_path)
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["signed", "verified"], default="verified"),
            # Renamed (docs/names.md: priv_key/pub_key, one suffix for files); the old names work until 2.0.0.
            priv_key_file=dict(type="path", aliases=["private_key_path"], deprecated_aliases=[deprecated_alias("private_key_path")]),
            priv_key_passphrase=dict(type="str", no_log=True, aliases=["private_key_passphrase"],
                                     deprecated_aliases=[deprecated_alias("private_key_passphrase")]),
            pub_key_file=dict(type="path", aliases=["public_key_path"], deprecated_aliases=[deprecated_alias("public_key_path")]),
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**_run(module))
    except ConstellationError as err:
        module.fail_json(msg=str(err))
    except OSError as err:
        module.fail_json(msg="%s: %s" % (getattr(err, "filename", None) or module.params["path"], err.strerror or err))


if __name__ == "__main__":
    main()
