#!/bin/sh
# Builds the collection tarball into OUTPUT_DIR (make build, scripts/galaxy-checks.sh, the tests that install the
# tarball): `ansible-galaxy collection build` of a staged copy of the checkout in which README.md is
# README.galaxy.md, the installed collection's README (what Galaxy renders: galaxy-importer reads README.md at the
# collection's root), while the repository keeps its own README.md (the lab, the tests, development).
# The staged copy holds the files git tracks or would track (untracked ones not ignored included);
# galaxy.yml's build_ignore then applies as usual.
#   sh scripts/build-collection.sh OUTPUT_DIR
set -eu
[ $# -eq 1 ] || { echo "usage: sh scripts/build-collection.sh OUTPUT_DIR" >&2; exit 2; }
out=$1
cd "$(dirname "$0")/.."
ROOT=$(pwd)
git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 || {
    echo "build-collection: $ROOT is not a git checkout (the staged copy takes the files git tracks)" >&2; exit 2; }
stage=$(mktemp -d /tmp/constellation-stage.XXXXXX)
trap 'rm -rf "$stage"' EXIT
git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$stage"
cp README.galaxy.md "$stage/README.md"
mkdir -p "$out"
ANSIBLE_CONFIG=$ROOT/ansible.cfg "$ROOT/.venv/bin/ansible-galaxy" collection build --force --output-path "$out" "$stage"
