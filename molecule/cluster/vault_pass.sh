#!/bin/sh
# The scenario's Ansible Vault password (ANSIBLE_VAULT_PASSWORD_FILE in molecule.yml): the one the
# lab wrote next to its inventory. ansible-playbook reads it at start, also for create (before the
# lab exists) and destroy; nothing is encrypted or decrypted then, so a placeholder does.
pass_file="${MOLECULE_EPHEMERAL_DIRECTORY:?}/lab/vault_pass"
if [ -r "$pass_file" ]; then
    cat "$pass_file"
else
    echo "no lab yet: nothing to decrypt"
fi
