# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real ansible-playbook runs of kms_key, master_secret and the KMS filters against localhost."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys

import pytest

from ansible.parsing.vault import VaultLib, VaultSecret
from tests.support import ROOT
from tests.support.playbook import run_tasks

pytestmark = pytest.mark.slow

VENV_BIN = os.path.join(ROOT, ".venv", "bin")
PYTHON = os.path.join(VENV_BIN, "python") if os.path.exists(os.path.join(VENV_BIN, "python")) else sys.executable

# HKDFMeasurementSecret (docs/kms.md, "Test vectors"): master key 40..5f, salt 60..7f
MASTER_KEY = bytes(range(0x40, 0x60))
MASTER_SALT = bytes(range(0x60, 0x80))
MEASUREMENT_SECRET_HEX = "4790578891f3fe6cc22cb661ecdc1b7e33121b1287546a52ba33a9136719c213"
# HKDF0xFF: key = salt = 32 x ff, disk UUID ffffffff-ffff-ffff-ffff-ffffffffffff
FF_DISK_KEY_HEX = "1484aa39d3415e906e07940ff215d8b1eee705d3027dba93306af4abff4f70be"
VAULT_PASSWORD = "correct horse battery staple"


def master_secret_json(key, salt):
    return json.dumps({"key": base64.b64encode(key).decode(), "salt": base64.b64encode(salt).decode()})


def cluster_kms_uri(key, salt):
    return "kms://cluster-kms?key=%s&salt=%s" % (base64.urlsafe_b64encode(key).decode(),
                                                 base64.urlsafe_b64encode(salt).decode())


def run_playbook(tmp_path, tasks, *extra, vault=False):
    """Runs the tasks on localhost; returns the run and {"results": {task name: result}, "changed": n}."""
    args = list(extra)
    if vault:
        pw = tmp_path / "vault-pass"
        pw.write_text(VAULT_PASSWORD + "\n")
        args += ["--vault-password-file", str(pw)]
    run = run_tasks(tmp_path, tasks, args, python=PYTHON,
                    env={"ANSIBLE_LOCAL_TEMP": tmp_path / "ansible-tmp", "ANSIBLE_REMOTE_TEMP": tmp_path / "ansible-tmp"})
    if not run.stats:
        raise AssertionError("ansible-playbook recorded nothing:\n%s" % run.stdout)
    return run, {"results": run.results(), "changed": run.changed()}


def results(doc):
    """Task name -> localhost result."""
    return doc["results"]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture()
def secret_file(tmp_path):
    path = tmp_path / "constellation-mastersecret.json"
    path.write_text(master_secret_json(MASTER_KEY, MASTER_SALT))
    return path


# ----------------------------------------------------------------------------- kms_key


def test_kms_key_writes_0600_idempotent_and_check_mode(tmp_path, secret_file):
    dest = tmp_path / "out" / "measurement.key"
    dest.parent.mkdir()
    task = {"name": "derive", "constellation.cluster.kms_key": {
        "master_secret_path": str(secret_file), "key_id": "measurementSecret", "dest": str(dest)}}

    proc, doc = run_playbook(tmp_path, [task], "--check", "--diff")
    assert proc.returncode == 0, proc.stdout
    res = results(doc)["derive"]
    assert res["changed"] is True
    assert "exists: false" in res["diff"]["before"] and "content: matches" in res["diff"]["after"]
    assert not dest.exists()

    proc, doc = run_playbook(tmp_path, [task], "--diff")
    assert proc.returncode == 0, proc.stdout
    assert results(doc)["derive"]["changed"] is True
    assert dest.read_bytes().hex() == MEASUREMENT_SECRET_HEX
    assert mode_of(dest) == 0o600
    assert MEASUREMENT_SECRET_HEX not in proc.stdout

    proc, doc = run_playbook(tmp_path, [task])
    assert proc.returncode == 0, proc.stdout
    assert results(doc)["derive"]["changed"] is False
    assert doc["changed"] == 0

    # a loosened mode is put right; a changed key ID rewrites the file
    os.chmod(dest, 0o644)
    proc, doc = run_playbook(tmp_path, [task])
    assert results(doc)["derive"]["changed"] is True and mode_of(dest) == 0o600
    task["constellation.cluster.kms_key"].update(key_id="measurementsecret", format="hex")
    proc, doc = run_playbook(tmp_path, [task])
    assert results(doc)["derive"]["changed"] is True
    assert dest.read_text() != MEASUREMENT_SECRET_HEX and len(dest.read_text()) == 64
    assert [p.name for p in dest.parent.iterdir()] == ["measurement.key"]


def test_kms_key_disk_uuid_from_uri_is_lower_cased(tmp_path):
    dest = tmp_path / "state.key"
    task = {"name": "disk", "constellation.cluster.kms_key": {
        "kms_uri": cluster_kms_uri(b"\xff" * 32, b"\xff" * 32),
        "disk_uuid": "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", "dest": str(dest), "format": "hex"}}
    proc, doc = run_playbook(tmp_path, [task])
    assert proc.returncode == 0, proc.stdout
    assert results(doc)["disk"]["key_id"] == "ffffffff-ffff-ffff-ffff-ffffffffffff"
    assert dest.read_text() == FF_DISK_KEY_HEX


def test_kms_key_errors_name_the_field(tmp_path, secret_file):
    tasks = [
        {"name": "bad_uri", "ignore_errors": True, "constellation.cluster.kms_key": {
            "kms_uri": "kms://cluster-kms?key=a2V5&key=a2V5&salt=c2FsdA==", "key_id": "x",
            "dest": str(tmp_path / "a")}},
        {"name": "aws", "ignore_errors": True, "constellation.cluster.kms_key": {
            "kms_uri": "kms://aws?region=eu-west-1&accessKeyID=AKIA&accessKey=s&keyName=k", "key_id": "x",
            "dest": str(tmp_path / "b")}},
        {"name": "return_without_no_log", "ignore_errors": True, "constellation.cluster.kms_key": {
            "master_secret_path": str(secret_file), "key_id": "x", "return_key": True}},
        {"name": "nowhere", "ignore_errors": True, "constellation.cluster.kms_key": {
            "master_secret_path": str(secret_file), "key_id": "x"}},
        {"name": "short_secret", "ignore_errors": True, "constellation.cluster.kms_key": {
            "kms_uri": cluster_kms_uri(b"k" * 15, b"s"), "key_id": "x", "dest": str(tmp_path / "c")}},
    ]
    proc, doc = run_playbook(tmp_path, tasks)
    res = results(doc)
    assert all(r.get("failed") for r in res.values()), res
    assert "key: expected exactly one value" in res["bad_uri"]["msg"]
    assert "not available on this controller" in res["aws"]["msg"]
    assert res["return_without_no_log"]["msg"].startswith("return_key: expected the task to have no_log")
    assert res["nowhere"]["msg"].startswith("dest:")
    assert "kms_uri" not in res["short_secret"]["msg"] or "key: expected at least 16 bytes" in res["short_secret"]["msg"]
    assert "key: expected at least 16 bytes" in res["short_secret"]["msg"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not any((tmp_path / n).exists() for n in "abc")


# ----------------------------------------------------------------------------- master_secret


def test_master_secret_creates_once_and_never_overwrites(tmp_path):
    path = tmp_path / "ms" / "constellation-mastersecret.json"
    path.parent.mkdir()
    task = {"name": "ms", "constellation.cluster.master_secret": {"path": str(path)}}

    proc, doc = run_playbook(tmp_path, [task], "--check")
    assert results(doc)["ms"]["changed"] is True and not path.exists()

    proc, doc = run_playbook(tmp_path, [task])
    assert proc.returncode == 0, proc.stdout
    assert results(doc)["ms"]["changed"] is True
    first = path.read_bytes()
    parsed = json.loads(first)
    assert set(parsed) == {"key", "salt"}
    assert len(base64.b64decode(parsed["key"])) == 32 and len(base64.b64decode(parsed["salt"])) == 32
    assert mode_of(path) == 0o600
    assert parsed["key"] not in proc.stdout

    proc, doc = run_playbook(tmp_path, [task])
    assert results(doc)["ms"]["changed"] is False
    assert path.read_bytes() == first

    # something else at the path is never replaced, and the task says why
    path.write_text("not a master secret")
    proc, doc = run_playbook(tmp_path, [dict(task, ignore_errors=True)])
    res = results(doc)["ms"]
    assert res["failed"] and "not a valid Constellation master secret" in res["msg"]
    assert path.read_text() == "not a master secret"


def test_master_secret_vault_output_decrypts(tmp_path):
    path = tmp_path / "constellation-mastersecret.json"
    task = {"name": "ms", "constellation.cluster.master_secret": {"path": str(path), "vault": True}}
    uri_file = tmp_path / "uri-key.hex"
    tasks = [task,
             {"name": "uri", "no_log": True, "ansible.builtin.set_fact": {
                 "cluster_kms_uri": "{{ lookup('ansible.builtin.file', '%s') | constellation.cluster.kms_uri }}" % path}},
             {"name": "key", "constellation.cluster.kms_key": {
                 "kms_uri": "{{ cluster_kms_uri }}", "key_id": "measurementSecret", "dest": str(uri_file)}}]
    proc, doc = run_playbook(tmp_path, tasks, vault=True)
    assert proc.returncode == 0, proc.stdout
    assert results(doc)["ms"]["vault_encrypted"] is True
    data = path.read_bytes()
    assert data.startswith(b"$ANSIBLE_VAULT;1.1;AES256") and mode_of(path) == 0o600
    plain = VaultLib([("default", VaultSecret(VAULT_PASSWORD.encode()))]).decrypt(data)
    doc_ms = json.loads(plain)
    key, salt = base64.b64decode(doc_ms["key"]), base64.b64decode(doc_ms["salt"])
    assert len(key) == 32 and len(salt) == 32
    # the filter read the vaulted file: the derived key matches one computed independently here
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    expected = HKDF(hashes.SHA256(), 32, salt, b"key-measurementSecret").derive(key)
    assert uri_file.read_bytes() == expected

    # second run: kept, checked by decrypting
    proc, doc = run_playbook(tmp_path, [task], vault=True)
    assert results(doc)["ms"]["changed"] is False and path.read_bytes() == data
    # without the vault secret it cannot be created (vault requested) nor checked, but it is kept
    proc, doc = run_playbook(tmp_path, [task])
    assert results(doc)["ms"]["changed"] is False and path.read_bytes() == data
    other = tmp_path / "other.json"
    proc, doc = run_playbook(tmp_path, [dict(task, ignore_errors=True, **{
        "constellation.cluster.master_secret": {"path": str(other), "vault": True}})])
    assert "vault: expected vault secrets" in results(doc)["ms"]["msg"] and not other.exists()


# ----------------------------------------------------------------------------- no leak at -vvvv


def _secret_forms(raw):
    return {raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
            base64.b64encode(raw).decode().rstrip("=")}


def test_no_key_material_in_vvvv_output(tmp_path, secret_file):
    uri = cluster_kms_uri(MASTER_KEY, MASTER_SALT)
    measurement = bytes.fromhex(MEASUREMENT_SECRET_HEX)
    dest = tmp_path / "k.bin"
    tasks = [
        {"name": "load", "no_log": True, "ansible.builtin.set_fact": {
            "uri_from_file": "{{ lookup('ansible.builtin.file', '%s') | constellation.cluster.kms_uri }}" % secret_file,
            "uri_from_parts": "{{ '%s' | constellation.cluster.kms_uri('%s') }}" % (
                base64.b64encode(MASTER_KEY).decode(), base64.b64encode(MASTER_SALT).decode())}},
        {"name": "derive", "no_log": True, "ansible.builtin.set_fact": {
            "ms_hex": "{{ uri_from_file | constellation.cluster.derive_key('measurementSecret', length=32) }}"}},
        {"name": "check", "ansible.builtin.assert": {"quiet": True, "that": [
            "uri_from_file == uri_from_parts", "ms_hex | length == 64"]}},
        {"name": "module_file", "constellation.cluster.kms_key": {
            "kms_uri": "{{ uri_from_parts }}", "key_id": "measurementSecret", "dest": str(dest)}},
        {"name": "module_return", "no_log": True, "register": "returned", "constellation.cluster.kms_key": {
            "master_secret_path": str(secret_file), "key_id": "measurementSecret", "return_key": True}},
        {"name": "compare", "ansible.builtin.assert": {"quiet": True, "that": [
            "returned.key == ms_hex"]}},
        {"name": "vaulted", "constellation.cluster.master_secret": {
            "path": str(tmp_path / "new-ms.json"), "vault": True}},
        {"name": "failing", "ignore_errors": True, "constellation.cluster.kms_key": {
            "kms_uri": "{{ uri_from_parts }}&salt=x", "key_id": "measurementSecret", "dest": str(dest)}},
    ]
    proc, doc = run_playbook(tmp_path, tasks, "-vvvv", "--diff", vault=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "ok=8" in output and "failed=0" in output and "ignored=1" in output
    assert "Traceback" not in output and results(doc)["failing"]["failed"]
    assert dest.read_bytes() == measurement  # the playbook really derived the key

    forbidden = set()
    for raw in (MASTER_KEY, MASTER_SALT, measurement):
        forbidden |= _secret_forms(raw)
    forbidden.add(uri)
    vaulted = VaultLib([("default", VaultSecret(VAULT_PASSWORD.encode()))]).decrypt(
        (tmp_path / "new-ms.json").read_bytes())
    for value in json.loads(vaulted).values():
        forbidden |= _secret_forms(base64.b64decode(value))
    leaked = sorted(f for f in forbidden if f in output)
    assert not leaked, "key material in -vvvv output: %s" % leaked
