# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The AKs certified in one playbook run, shared by the run's processes (qemu-vtpm-ek).

Ansible runs every task in a process of its own, and the atls connection keeps its relay in
another: each would enroll every peer again (EnrollAK: the EK recreated in the node's TPM, a
credential activation, two more handshakes) although the controller certified that AK moments
before. The certified AK records (AK public area + EK certificate; no secret) of one run are
kept in a file of the connection's private control folder (0700), named after the playbook
process and its start time, so a later run never reads them: it enrolls every peer again.

Only enrollment is shared. Every connection is still attested in full: a new nonce, a quote by
that AK over the PCRs, checked against the policy; a record is taken only if its EK certificate
chains to the trusted CAs, and the chain is checked again at every use (ek.VTPMEKValidator).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from typing import Optional

RECORDS_MAX_BYTES = 1 << 20
DEFAULT_DIR = "~/.ansible/cp"
_FILE_RE = re.compile(r"^aks-(\d+)-(\d+)\.jsonl$")


def _start_time(pid: int) -> Optional[str]:
    """The process's start time (clock ticks since boot, /proc), or None where there is no /proc."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def _private_dir(path: str) -> bool:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o077


def records_path(directory: Optional[str], playbook_pid) -> Optional[str]:
    """This run's records file, or None when it cannot be kept privately (then nothing is shared)."""
    try:
        pid = int(playbook_pid)
    except (TypeError, ValueError):
        return None
    directory = os.path.expanduser(directory or DEFAULT_DIR)
    started = _start_time(pid) or "0"
    if pid <= 1 or not _private_dir(directory):
        return None
    return os.path.join(directory, "aks-%d-%s.jsonl" % (pid, started))


def _prune(directory: str, keep: str) -> None:
    """Removes the records of runs that ended."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _FILE_RE.match(name)
        if not match or name == keep:
            continue
        pid = int(match.group(1))
        if (_start_time(pid) or "0") != match.group(2) or not _alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def share(trust, directory: Optional[str], playbook_pid):
    """``trust`` (attestation.choose.Trust) with a registry of certified AKs that starts with the
    run's records and adds every new enrollment to them. ``trust`` itself where the variant
    certifies no AKs or the records cannot be kept privately."""
    if trust is None or trust.certified_aks is None:
        return trust
    path = records_path(directory, playbook_pid)
    if path is None:
        return trust
    from dataclasses import replace

    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import ek
    from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode

    class RunCertifiedAKs(ek.CertifiedAKs):
        """A CertifiedAKs that also appends what it certifies to the run's records. The run's records
        are taken when first asked for: a task attests one peer, and checking the EK chain of every
        record up front cost each task and host of a 64-host run 64 chain checks."""

        def __init__(self, ca_certs, unchecked):
            super().__init__(ca_certs)
            self._unchecked = unchecked  # {ak_pub: record dict} of the run's records, EK chain not checked yet

        def add(self, record) -> None:
            super().add(record)
            _append(path, record.to_dict())

        def get(self, ak_pub: bytes):
            found = super().get(ak_pub)
            if found is not None:
                return found
            with self._lock:
                data = self._unchecked.pop(ak_pub, None)
            if data is None:
                return None
            try:
                ek.CertifiedAKs.add(self, ek.CertifiedAK.from_dict(data))  # checks the EK chain
            except Exception:  # pylint: disable=broad-except
                return None  # a record that does not chain (another CA) is not taken: that peer enrolls
            return super().get(ak_pub)

    unchecked = {}
    for data in _read(path):
        try:
            unchecked[b64decode(data.get("ak_pub"), "certified_ak.ak_pub", max_size=64 * 1024)] = data
        except Exception:  # pylint: disable=broad-except
            continue  # not a record
    return replace(trust, certified_aks=RunCertifiedAKs(trust.ek_ca_certs, unchecked))


def _read(path: str):
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return []
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return []
        fcntl.flock(handle, fcntl.LOCK_SH)
        data = handle.read(RECORDS_MAX_BYTES)
    records = []
    for line in data.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            records.append(item)
    return records


def _append(path: str, data) -> None:
    new = not os.path.exists(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return
    with os.fdopen(fd, "ab") as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write((json.dumps(data, sort_keys=True) + "\n").encode("ascii"))
    if new:
        _prune(os.path.dirname(path), os.path.basename(path))
