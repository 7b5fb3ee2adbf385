#!/bin/sh
# Installs everything the project needs on a Debian 12 machine (run as root).
# Idempotent: a second run installs nothing and takes about a second.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# What the node agent imports on a Debian 12 node, as the node_agent role installs it (its *_packages lists;
# tests/unit/test_node_packages.py keeps them in step): a lab host runs its agent on /usr/bin/python3 with these.
AGENT_PACKAGES="python3-cryptography python3-yaml python3-tpm2-pytss python3-grpcio python3-protobuf python3-etcd3gw python3-kubernetes"
DEB_PACKAGES="iputils-ping swtpm swtpm-tools tpm2-tools shellcheck libtss2-dev pkg-config python3-apt $AGENT_PACKAGES wireguard-tools wireguard-go etcd-server iproute2 openssh-server openssl make git cryptsetup-bin"
# The pod network: Debian's CNI plugins (bridge, host-local, portmap, loopback) and nft, as on a node
# (tests/integration/test_pod_network.py); iperf3 and tcpdump for the lab's pod benchmark and underlay capture.
DEB_PACKAGES="$DEB_PACKAGES containernetworking-plugins nftables iperf3 tcpdump"
# Tests only: an independent Authenticode digest (tests/unit/attestation/test_image_prediction.py).
DEB_PACKAGES="$DEB_PACKAGES osslsigncode"
# The node image (python -m image build / boot, docs/image.md): the root file system, dm-verity, the UKI's stub and
# objcopy, the ESP and GPT tools, and QEMU with OVMF (its version is pinned by the predicted PCR 7).
DEB_PACKAGES="$DEB_PACKAGES mmdebstrap cryptsetup-bin systemd-boot-efi binutils dosfstools mtools e2fsprogs fdisk cpio qemu-system-x86 ovmf"

missing=""
for p in $DEB_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # etcd-server and ssh would start system services; the project starts its own on loopback.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    # shellcheck disable=SC2086 # one word per package
    apt-get install -y -qq --no-install-recommends $missing
    rm -f /usr/sbin/policy-rc.d
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.deps-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
    echo "setup: installing Python dependencies (pinned in pyproject.toml)"
    log=$(mktemp)
    if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e ".[dev]"; } >"$log" 2>&1; then
        grep -v "^WARNING: Location" "$log" >&2; rm -f "$log"; exit 1
    fi
    rm -f "$log"
    rm -f .venv/.deps-*
    touch "$stamp"
fi

# make test's Galaxy checks (scripts/galaxy-checks.sh: galaxy-importer, antsibull-docs) in their own environment,
# .venv/tools: galaxy-importer pins older libraries than .venv has (scripts/galaxy-tools.txt).
tools_stamp=.venv/tools/.deps-$(sha256sum scripts/galaxy-tools.txt | cut -c1-16)
if [ ! -f "$tools_stamp" ]; then
    echo "setup: installing galaxy-importer and antsibull-docs into .venv/tools (scripts/galaxy-tools.txt)"
    log=$(mktemp)
    if ! { { [ -x .venv/tools/bin/python ] || "$PY" -m venv .venv/tools; } \
            && .venv/tools/bin/python -m pip install -q -r scripts/galaxy-tools.txt; } >"$log" 2>&1; then
        grep -v "^WARNING: Location" "$log" >&2; rm -f "$log"; exit 1
    fi
    rm -f "$log" .venv/tools/.deps-*
    touch "$tools_stamp"
fi

# collections/ansible_collections/constellation/cluster -> repository root, so that
# ansible.cfg's collections_path finds constellation.cluster (README.md).
mkdir -p collections/ansible_collections/constellation
[ -L collections/ansible_collections/constellation/cluster ] || ln -sfn ../../.. collections/ansible_collections/constellation/cluster

# ansible-test's virtual environments download get-pip.py from a host that is not reachable
# here; this stand-in uses ensurepip plus pip.
GETPIP="$HOME/.ansible/test/cache/get_pip_24_2.py"
if [ ! -f "$GETPIP" ]; then
    mkdir -p "$(dirname "$GETPIP")"
    cp scripts/get_pip_standin.py "$GETPIP"
fi
echo "setup: ok ($ROOT)"
