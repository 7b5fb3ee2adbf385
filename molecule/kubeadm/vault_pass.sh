#!/bin/sh
# The scenario's Ansible Vault password (ANSIBLE_VAULT_PASSWORD_FILE in molecule.yml), a test value:
# the admin kubeconfig h1's init returns is stored vault-encrypted with it on the controller.
echo "molecule-kubeadm-test-vault-password"
