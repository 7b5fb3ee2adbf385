#!/bin/sh
# make demo: a 4-host lab (1 Coordinator, 3 Nodes), site.yml twice (the second run changes
# nothing), then playbooks/verify.yml, which prints the cluster table. HOSTS=6 COORDINATORS=3: the
# first 3 hosts are Coordinators (one etcd member each), the Coordinator activates the other two.
set -eu
cd "$(dirname "$0")/.."
HOSTS="${HOSTS:-4}"
COORDINATORS="${COORDINATORS:-1}"
VENV="$PWD/.venv/bin"
export PATH="$VENV:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
INV="inventories/lab"
PLAY="ansible-playbook -i $INV/hosts.yml --vault-password-file $INV/vault_pass -e ansible_python_interpreter=$VENV/python"

echo "== building the lab: $HOSTS hosts, $COORDINATORS Coordinator(s) (network namespace, swtpm, node agent each)"
"$VENV/python" -m lab up --hosts "$HOSTS" --coordinators "$COORDINATORS" --agents
echo "== site.yml, first run: attest all, activate the Coordinator, it activates the further Coordinators and the Nodes"
$PLAY site.yml
echo "== site.yml, second run: nothing changes"
$PLAY site.yml | tee /tmp/constellation-demo-second-run.log
if grep -Eq 'changed=[1-9]' /tmp/constellation-demo-second-run.log; then
    echo "second run changed something" >&2
    exit 1
fi
echo "== verify.yml: every peer attested against the policy"
$PLAY playbooks/verify.yml
echo "== the lab stays up: '.venv/bin/python -m lab status', '... down'"
