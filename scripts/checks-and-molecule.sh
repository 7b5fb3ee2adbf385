#!/bin/sh
# The last part of `make test`: ansible-lint, then ansible-test sanity, the collection build and Galaxy's checks
# (scripts/galaxy-checks.sh: galaxy-importer, antsibull-docs, antsibull-changelog) (CPU, no lab) while every
# Molecule scenario runs (lab hosts, mostly waiting on them). Molecule
# uses the checkout through its own ANSIBLE_COLLECTIONS_PATH and ansible-test a private bind mount,
# so neither sees the other's files. Prints each part's output and fails if any part failed.
set -u
cd "$(dirname "$0")/.." || exit 1
make --no-print-directory lint || exit 1
log=$(mktemp -d /tmp/constellation-checks.XXXXXX)
(sh scripts/sanity.sh && make --no-print-directory build && sh scripts/galaxy-checks.sh) >"$log/checks.log" 2>&1 &
checks=$!
sh scripts/molecule.sh
molecule_rc=$?
wait "$checks"
checks_rc=$?
cat "$log/checks.log"
rm -rf "$log"
[ "$checks_rc" -eq 0 ] || echo "sanity, build or Galaxy's checks: FAILED (exit $checks_rc)"
[ "$molecule_rc" -eq 0 ] && [ "$checks_rc" -eq 0 ]
