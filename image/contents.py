# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the build puts into the unpacked root file system: the agent (the collection's plugins/module_utils and
bin/constellation-agent, laid out as the node_agent role installs them), its baked configuration and trust
material (/etc/constellation), the systemd units, and the settings of a read-only, login-less system."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

from image.paths import NODE_SETTINGS_SERIAL, REPO_ROOT, STATE_DISK_SERIAL

AGENT_DIR = "opt/constellation-agent"
CODE_DIR = AGENT_DIR + "/collections/ansible_collections/constellation/cluster/plugins/module_utils"
CONFIG_DIR = "etc/constellation"
STATE_DIR = "/run/constellation-agent"  # tmpfs: the node's lasting state is on the state disk
AGENT_PORT = 9000
UNIT = """\
[Unit]
Description=constellation.cluster node agent (image)
Documentation=file:///usr/share/doc/constellation-agent/image.md
# PCR 11 holds the "ready" phase before the agent quotes it.
After=systemd-pcrphase.service network-online.target
Wants=systemd-pcrphase.service network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/python3 /%(agent_dir)s/bin/constellation-agent --config /%(config_dir)s/agent.json
KillSignal=SIGTERM
TimeoutStopSec=15
Restart=on-failure
RestartSec=2
Environment=TSS2_LOG=all+none
UMask=0077
# No firmware event log in the agent's quotes: systemd 252 does not log the boot phases it extends PCR 11 with,
# so a replay of that log never reaches the quoted PCR 11. The image's set enforces PCRs 4, 7, 9 and 11 by their
# predicted values instead (docs/image.md, "Event log").
TemporaryFileSystem=/sys/kernel/security
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
""" % {"agent_dir": AGENT_DIR, "config_dir": CONFIG_DIR}
# The guest's network: DHCP on every Ethernet interface (QEMU's user network, a cloud's).
NETWORK = """\
[Match]
Name=en* eth*

[Network]
DHCP=yes
"""
# systemd-pcrphase extends PCR 11 with "sysinit" and "ready" (the agent quotes after "ready"). Seen once in about
# ten boots under TCG: the "ready" extend failed (its TPM call), the agent quoted PCR 11 at "sysinit" and the
# attestation was refused. A failed attempt extends nothing, so it is tried again; its messages go to the console.
PCRPHASE_DROPIN = """\
[Service]
Restart=on-failure
RestartSec=1
StandardOutput=journal+console
StandardError=journal+console
"""
FSTAB = """\
# The root is the dm-verity device (read-only); everything written at run time is on tmpfs.
/dev/mapper/root / ext4 ro,noatime 0 0
tmpfs /tmp tmpfs mode=1777,nosuid,nodev 0 0
tmpfs /var/tmp tmpfs mode=1777,nosuid,nodev 0 0
tmpfs /var/log tmpfs mode=0755,nosuid,nodev 0 0
tmpfs /var/lib tmpfs mode=0755,nosuid,nodev 0 0
"""


def agent_config(deployment_mode: str, measurements: bool) -> Dict[str, Any]:
    """The agent's baked configuration (docs/image.md, "Contents")."""
    config: Dict[str, Any] = {
        "deployment_mode": deployment_mode,
        "variant": "qemu-vtpm-ek",
        "ek_ca": "/%s/ek_ca.pem" % CONFIG_DIR,
        "measurements_pub_key": "/%s/measurements.pub" % CONFIG_DIR,
        "tcti": "device:/dev/tpmrm0",
        "state_dir": STATE_DIR,
        "public_endpoint": "0.0.0.0:%d" % AGENT_PORT,
        "state_disk_device": "/dev/disk/by-id/virtio-%s" % STATE_DISK_SERIAL,
    }
    if deployment_mode == "image":
        config["node_settings"] = "/dev/disk/by-id/virtio-%s" % NODE_SETTINGS_SERIAL
    if measurements:
        config["measurements"] = "/%s/measurements.json" % CONFIG_DIR
    return config


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def _enable(root: Path, unit: str, target: str = "multi-user.target") -> None:
    wants = root / "etc/systemd/system" / (target + ".wants")
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit
    if link.is_symlink() or link.exists():
        link.unlink()
    source = "/etc/systemd/system/" + unit
    if not (root / source.lstrip("/")).exists():
        source = "/lib/systemd/system/" + unit
    link.symlink_to(source)


def _mask(root: Path, unit: str) -> None:
    link = root / "etc/systemd/system" / unit
    if link.is_symlink() or link.exists():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("/dev/null")


def install_agent(root: Path) -> List[str]:
    """The agent's code, as the node_agent role lays it out; returns the files (relative to module_utils)."""
    source = REPO_ROOT / "plugins/module_utils"
    dest = root / CODE_DIR
    if dest.exists():
        shutil.rmtree(dest)
    files = sorted(str(p.relative_to(source)) for p in source.rglob("*.py") if "__pycache__" not in p.parts)
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)
    bindir = root / AGENT_DIR / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO_ROOT / "bin/constellation-agent", bindir / "constellation-agent")
    os.chmod(bindir / "constellation-agent", 0o755)
    if (REPO_ROOT / "docs/image.md").exists():
        shutil.copyfile(REPO_ROOT / "docs/image.md", _docdir(root) / "image.md")
    return files


def _docdir(root: Path) -> Path:
    path = root / "usr/share/doc/constellation-agent"
    path.mkdir(parents=True, exist_ok=True)
    return path


def install_config(root: Path, ek_ca_pem: str, measurements_pub_pem: str, deployment_mode: str,
                   measurements: Optional[bytes] = None, measurements_sig: Optional[bytes] = None) -> Dict[str, Any]:
    """/etc/constellation: agent.json, ek_ca.pem, measurements.pub (and a signed policy when given)."""
    config = agent_config(deployment_mode, measurements is not None)
    _write(root, CONFIG_DIR + "/agent.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write(root, CONFIG_DIR + "/ek_ca.pem", ek_ca_pem)
    _write(root, CONFIG_DIR + "/measurements.pub", measurements_pub_pem)
    if measurements is not None:
        (root / CONFIG_DIR / "measurements.json").write_bytes(measurements)
        (root / CONFIG_DIR / "measurements.json.sig").write_bytes(measurements_sig or b"")
    return config


def install_system(root: Path, debug: bool) -> None:
    """Units, network, fstab, and no login (a console getty only with ``debug``)."""
    _write(root, "etc/systemd/system/constellation-agent.service", UNIT)
    _enable(root, "constellation-agent.service")
    _write(root, "etc/systemd/network/80-dhcp.network", NETWORK)
    _enable(root, "systemd-networkd.service")
    _enable(root, "systemd-pcrphase.service", "sysinit.target")
    for unit in ("systemd-pcrphase.service", "systemd-pcrphase-sysinit.service"):
        _write(root, "etc/systemd/system/%s.d/constellation.conf" % unit, PCRPHASE_DROPIN)
    _write(root, "etc/fstab", FSTAB)
    _write(root, "etc/hostname", "constellation-node\n")
    _write(root, "etc/modules-load.d/constellation.conf", "wireguard\ntpm_crb\n")
    # An empty machine-id: systemd makes a fresh one per boot on the read-only root.
    _write(root, "etc/machine-id", "", 0o444)
    for unit in ("systemd-firstboot.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        _mask(root, unit)
    if debug:
        # The debug variant: a root shell on the serial console (no password). It measures differently.
        _write(root, "etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf",
               "[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200 %I $TERM\n")
    else:
        for unit in ("getty@.service", "serial-getty@.service", "getty.target", "console-getty.service"):
            _mask(root, unit)
    # No password for anyone: the shadow file's root entry is locked ('*').
    shadow = root / "etc/shadow"
    lines = shadow.read_text().splitlines()
    shadow.write_text("\n".join(("root:*:" + l.split(":", 2)[2]) if l.startswith("root:") else l
                                for l in lines) + "\n")
