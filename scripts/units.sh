#!/bin/sh
# `make test`'s and `make units`' unit tests: ansible-test units (as collection users run them), then a check
# that they left no swtpm, etcd or /dev/shm entry behind (tests/support/leftovers.py: ansible-test forks for
# every test and ends the fork without tearing down session fixtures; tests/unit/worker_fixtures.py).
#   sh scripts/units.sh [tests/unit/...]
set -eu
cd "$(dirname "$0")/.."
snapshot=$(mktemp /tmp/constellation-units.XXXXXX)
trap 'rm -f "$snapshot"' EXIT
.venv/bin/python -m tests.support.leftovers snapshot "$snapshot"
sh scripts/ansible-test.sh units "$@"
.venv/bin/python -m tests.support.leftovers check "$snapshot"
