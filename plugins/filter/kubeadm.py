# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters around kubeadm: ``ca_cert_hash`` (the pinned discovery hash of a CA certificate)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import ca_cert_hash as _ca_cert_hash


def ca_cert_hash(ca_pem):
    """``sha256:<hex>`` of the certificate's SubjectPublicKeyInfo, as kubeadm pins it."""
    try:
        return _ca_cert_hash(ca_pem)
    except ConstellationError as err:
        raise AnsibleFilterError("ca_cert_hash: %s" % err) from None


class FilterModule(object):
    def filters(self):
        return {"ca_cert_hash": ca_cert_hash}
