#!/bin/sh
# ansible-test sanity on the collection (scripts/ansible-test.sh). Extra arguments go to
# ansible-test (e.g. a list of files, or --test pep8).
set -eu
exec sh "$(dirname "$0")/ansible-test.sh" sanity "$@"
