# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of the collection's plugins (never sent to a node)."""

import warnings

_LIBRARIES = r"(tpm2_pytss|cryptography|OpenSSL|grpc|google\.protobuf|kubernetes|urllib3|yaml)(\.|$)"


def quiet_library_warnings() -> None:
    """Keeps library warnings off Ansible's output for the rest of this process: a deprecation that a library we
    call raises (a CryptographyDeprecationWarning from cryptography or tpm2-pytss, a DeprecationWarning of grpc,
    protobuf, the kubernetes client, urllib3, PyYAML) is for that library's maintainers, not for the operator, and
    says nothing about the cluster. The cluster actions and the atls connection call it as a task starts: Ansible
    loads a plugin inside ``warnings.catch_warnings()``, so filters set while it is imported do not last (the
    imports of tpm2-pytss are quiet by themselves: attestation/tpm.py ``quiet_import``). Idempotent."""
    warnings.filterwarnings("ignore", module=_LIBRARIES)
    try:
        from cryptography.utils import CryptographyDeprecationWarning
    except ImportError:  # the actions say so where they need it
        return
    warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning)
