#!/bin/sh
# Runs every Molecule scenario under molecule/ (one per role, plus kubeadm without kubeadm) on lab
# hosts: network namespaces built by molecule/shared/create.yml, no Docker. Fails if any fails.
# Each scenario: create (fresh lab hosts), converge, idempotence (second converge, changed=0),
# verify, destroy. Arguments: scenario names to run only those (default: all).
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PATH="$ROOT/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
export ANSIBLE_NOCOLOR=1 NO_COLOR=1
if [ "$(id -u)" != 0 ]; then
    echo "molecule: skipped, the lab hosts need root (network namespaces)"
    exit 0
fi
if [ $# -gt 0 ]; then
    scenarios="$*"
else
    scenarios=$(for f in molecule/*/molecule.yml; do basename "$(dirname "$f")"; done)
fi
logdir=$(mktemp -d /tmp/constellation-molecule.XXXXXX)
failed=""
passed=0
for s in $scenarios; do
    start=$(date +%s)
    # A run that was interrupted leaves molecule's state saying "created": the next run would skip
    # create and fail on hosts that are gone. Forget it (create rebuilds the lab hosts anyway).
    molecule reset -s "$s" >"$logdir/$s.reset.log" 2>&1 || true
    # The lab's agent logs, copied by molecule/shared/lab_ctl.py before each destroy.
    export CONSTELLATION_MOLECULE_LOGS="$logdir/$s.agents"
    if molecule test -s "$s" >"$logdir/$s.log" 2>&1; then
        passed=$((passed + 1))
        echo "molecule $s: passed ($(($(date +%s) - start)) s)"
    else
        failed="$failed $s"
        echo "molecule $s: FAILED ($(($(date +%s) - start)) s); last lines of $logdir/$s.log:"
        tail -n 40 "$logdir/$s.log" | sed 's/^/    /'
        for agent_log in "$logdir/$s.agents"/*/*.agent.log; do
            [ -f "$agent_log" ] || continue
            echo "    last lines of $agent_log:"
            tail -n 15 "$agent_log" | sed 's/^/        /'
        done
    fi
done
nfailed=$(echo "$failed" | wc -w)
echo "molecule: $passed passed, $nfailed failed"
[ -z "$failed" ] && rm -rf "$logdir"
[ -z "$failed" ]
