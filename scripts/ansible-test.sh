#!/bin/sh
# Runs ansible-test (sanity or units) on the collection. ansible-test wants the source under
# .../ansible_collections/constellation/cluster and resolves symlinks, so the repository
# is bind-mounted there inside a private mount namespace (.github/README.md).
#   sh scripts/ansible-test.sh sanity [--test pep8 ...]
#   sh scripts/ansible-test.sh units [tests/unit/...]
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DIR=$(mktemp -d /tmp/constellation-ansible-test.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR/ansible_collections/constellation/cluster"
export PATH="$ROOT/.venv/bin:$PATH"
# shellcheck disable=SC2016 # the inner shell expands its own arguments
unshare --mount --propagation private sh -c '
    mount --bind "$1" "$2/ansible_collections/constellation/cluster"
    cd "$2/ansible_collections/constellation/cluster"
    shift 2
    command=$1
    shift
    ansible-test "$command" --local --python 3.11 --color no "$@"
' sh "$ROOT" "$DIR" "$@"
