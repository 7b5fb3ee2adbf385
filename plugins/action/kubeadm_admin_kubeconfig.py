# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin kubeadm_admin_kubeconfig: keeps the admin kubeconfig kubeadm_init returned on the
controller, beside the master secret, with the master secret's file handling (WriteOnceSecretAction:
0600, atomic, never overwritten, optionally Ansible Vault with the play's secrets). Documentation in
plugins/modules/kubeadm_admin_kubeconfig.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail

from ansible_collections.constellation.cluster.plugins.action.master_secret import WriteOnceSecretAction
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import KUBEADM_ADMIN_KUBECONFIG_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.pki import kubeconfig_client_identity

CONTENT = "content"


class ActionModule(WriteOnceSecretAction):
    WHAT = "admin kubeconfig"
    READ_LIMIT = 1024 * 1024
    _VALID_ARGS = frozenset(KUBEADM_ADMIN_KUBECONFIG_ARGS)

    _content = b""
    _identity = None

    def run(self, tmp=None, task_vars=None):
        # The base class validates path, vault and vault_id; the kubeconfig travels beside them.
        args = dict(self._task.args)
        content = args.pop(CONTENT, None)
        if not isinstance(content, str) or not content.strip():
            raise AnsibleActionFail("content: expected the admin kubeconfig (kubeadm_init's kubeconfig), got nothing")
        try:
            self._identity = kubeconfig_client_identity(content)
        except InputError:
            raise AnsibleActionFail("content: expected a kubeconfig with a current context, a client certificate "
                                    "and CA data") from None
        self._content = content.encode("utf-8")
        original = self._task.args
        self._task.args = args
        try:
            result = super().run(tmp, task_vars)
        finally:
            self._task.args = original
        result["user"] = self._identity["user"]
        return result

    def _generate(self) -> bytes:
        return self._content

    def _check_content(self, data: bytes) -> None:
        """An existing file is kept when it is a kubeconfig of the same user and cluster CA; a kubeconfig of
        another cluster (another CA) is not overwritten: the task fails and names it."""
        existing = kubeconfig_client_identity(data.decode("utf-8"))
        if existing["ca_pem"] != self._identity["ca_pem"]:
            raise ValueError("it belongs to another cluster (its CA is not this cluster's); move it away to store "
                             "this cluster's")
        if existing["user"] != self._identity["user"]:
            raise ValueError("it is the kubeconfig of %s, not of %s" % (existing["user"], self._identity["user"]))
