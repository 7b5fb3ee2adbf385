#!/bin/sh
# Galaxy's own checks of the collection, part of make test's checks (scripts/checks-and-molecule.sh):
#   galaxy-importer on the built tarball (as Galaxy imports it: ansible-doc on every plugin; ansible-test and
#   ansible-lint off, make test runs both itself), antsibull-docs lint-collection-docs --plugin-docs (the
#   plugins' documentation markup and references) and antsibull-changelog lint (the fragments).
# The tools live in .venv/tools (scripts/galaxy-tools.txt, installed by scripts/setup.sh).
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TOOLS=$ROOT/.venv/tools/bin
work=$(mktemp -d /tmp/constellation-galaxy.XXXXXX)
trap 'rm -rf "$work"' EXIT

sh scripts/build-collection.sh "$work" >/dev/null
printf '[galaxy-importer]\nRUN_ANSIBLE_TEST = False\nRUN_ANSIBLE_LINT = False\n' >"$work/importer.cfg"
# galaxy-importer exits 1 on what refuses an import; what it logs as ERROR fails here too.
(cd "$work" && PATH="$TOOLS:$PATH" GALAXY_IMPORTER_CONFIG="$work/importer.cfg" \
    "$TOOLS/python" -m galaxy_importer.main constellation-cluster-*.tar.gz >"$work/importer.log" 2>&1) || {
    cat "$work/importer.log"; echo "galaxy-importer: FAILED"; exit 1; }
if grep -q "^ERROR" "$work/importer.log"; then
    grep "^ERROR" "$work/importer.log"; echo "galaxy-importer: FAILED"; exit 1
fi
echo "galaxy-importer: ok"

# The collections galaxy.yml depends on (kubernetes.core, community.crypto, community.general) come with the
# `ansible` package in .venv; antsibull-docs resolves references into them.
BUNDLED=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PATH="$TOOLS:$PATH" ANSIBLE_COLLECTIONS_PATH=$ROOT/collections:$BUNDLED \
    "$TOOLS/antsibull-docs" lint-collection-docs --plugin-docs collections/ansible_collections/constellation/cluster
echo "antsibull-docs lint-collection-docs: ok"

.venv/bin/antsibull-changelog lint
echo "antsibull-changelog lint: ok"
