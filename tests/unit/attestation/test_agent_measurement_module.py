# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent_measurement module through ansible-playbook (its action plugin, on the controller): the value of this
collection's agent, of an archive and of a source tree; the document kept signed, atomically, in check mode and
diff, idempotent; bad input refused with the option named and the document and its signature left as they were."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement as am
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, signature
from ansible_collections.constellation.cluster.tests.unit.attestation.conftest import INVENTORY_PCRS as PCRS
from tests.support import ROOT
from tests.support.keys import measurements_key
from tests.support.playbook import run_tasks

WARNING = "Say which agent entry the measurements document should list"


def play(tmp_path, tasks, *args):
    # As site.yml gives them: the trust configuration and the document through the action group's defaults.
    defaults = {"group/constellation.cluster.attestation": {
        "variant": "qemu-vtpm-ek", "ek_ca_path": "ek_ca.pem", "measurements_file": "measurements.json",
        "measurements_pub_key_file": "measurements.pub"}}
    run = run_tasks(tmp_path, tasks, args, play={"module_defaults": defaults}, cwd=tmp_path)  # relative: to the play
    return run, run.results()


def task(title, **options):
    extra = {k: options.pop(k) for k in ("check_mode", "diff", "ignore_errors") if k in options}
    return dict({"name": title, "constellation.cluster.agent_measurement": options}, **extra)


def expected(tmp_path, root=None):
    trust = choose.load_trust("qemu-vtpm-ek", str(tmp_path / "ek_ca.pem"))
    return am.AgentMeasurement.of("qemu-vtpm-ek", trust.ek_ca_certs, root)


def state(tmp_path):
    return (tmp_path / "measurements.json").read_bytes(), (tmp_path / "measurements.json.sig").read_bytes()


def test_the_value_of_this_collection_an_archive_and_a_tree_and_check_mode_writes_nothing(inv):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted((ROOT / "plugins" / "module_utils").rglob("*.py")):
            tar.add(str(path), path.relative_to(ROOT / "plugins" / "module_utils").as_posix())
    (inv / "agent.tar.gz").write_bytes(buf.getvalue())
    before = state(inv)
    run, res = play(inv, [
        task("own"), task("archive", archive="agent.tar.gz"), task("tree", src=str(ROOT)),
        task("check", name="0.3.0", priv_key_file="measurements.key", check_mode=True, diff=True)], "--diff")
    assert run.ok, run.stdout
    want = expected(inv)
    assert res["own"]["value"] == want.value.hex() and res["own"]["entry"] == want.to_dict()
    assert res["own"]["events"] == want.to_dict()["events"] and res["own"]["code_digest"] == want.code.hex()
    assert res["own"]["config_digest"] == want.config.hex() and not res["own"]["changed"]
    assert res["archive"]["value"] == res["tree"]["value"] == want.value.hex()
    assert res["archive"]["archive_sha256"] == hashlib.sha256(buf.getvalue()).hexdigest()
    check = res["check"]
    assert check["changed"] and check["version"] == 1 and check["entry"] == want.to_dict()
    assert json.loads(check["diff"]["before"]) == PCRS
    assert json.loads(check["diff"]["after"]) == {"version": 1, "accepted": {"default": PCRS},
                                                  "agents": {"0.3.0": want.to_dict()}}
    assert state(inv) == before  # check mode wrote nothing


def test_the_document_lists_the_agent_signed_once_and_retires_it(inv):
    run, res = play(inv, [
        task("add", name="0.3.0", priv_key_file="measurements.key"),
        task("again", name="0.3.0", priv_key_file="measurements.key"),
        task("again without the key", name="0.3.0")])
    assert run.ok, run.stdout
    assert res["add"]["changed"] and res["add"]["version"] == 1
    assert not res["again"]["changed"] and not res["again without the key"]["changed"]
    pub = signature.load_public_key_file(str(inv / "measurements.pub"))
    doc = json.loads(signature.read_signed_file(str(inv / "measurements.json"), pub))
    assert doc == {"version": 1, "accepted": {"default": PCRS}, "agents": {"0.3.0": expected(inv).to_dict()}}
    listed = state(inv)

    run, res = play(inv, [
        task("retire", name="0.3.0", state="absent", priv_key_file="measurements.key"),
        task("retire again", name="0.3.0", state="absent", priv_key_file="measurements.key")])
    assert run.ok, run.stdout
    assert res["retire"]["changed"] and res["retire"]["version"] == 2
    assert res["retire"]["entry"] == expected(inv).to_dict() and not res["retire again"]["changed"]
    assert json.loads(signature.read_signed_file(str(inv / "measurements.json"), pub)) == {
        "version": 2, "accepted": {"default": PCRS}}
    assert state(inv) != listed


def test_bad_input_is_refused_naming_the_option_and_leaves_the_document(inv):
    (inv / "evil.tar.gz").write_bytes(_tar({"../evil.py": b"x"}))
    (inv / "not-a-key.pem").write_text("not a key\n")
    other = measurements_key(inv / "other.pub")
    (inv / "other.key").write_bytes(other.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    before = state(inv)
    run, res = play(inv, [
        task("missing archive", archive="missing.tar.gz", ignore_errors=True),
        task("bad member", archive="evil.tar.gz", ignore_errors=True),
        task("both", archive="evil.tar.gz", src=str(ROOT), ignore_errors=True),
        task("unknown variant", variant="qemu-tdx", ignore_errors=True),
        task("no EK CA", ek_ca_path="missing-ca.pem", ignore_errors=True),
        task("bad key", name="0.3.0", priv_key_file="not-a-key.pem", ignore_errors=True),
        task("another key", name="0.3.0", priv_key_file="other.key", ignore_errors=True),
        task("signed without a key", name="0.3.0", ignore_errors=True),
        task("bad name", name="../0.3.0", priv_key_file="measurements.key", ignore_errors=True),
        task("retire nothing named", state="absent", ignore_errors=True)])
    assert run.ok, run.stdout
    msgs = {name: result.get("msg", "") for name, result in res.items()}
    assert all(res[name]["failed"] for name in msgs), msgs
    assert msgs["missing archive"].startswith("archive: expected a readable gzipped tar") and "missing.tar.gz" in msgs[
        "missing archive"]
    assert msgs["bad member"].startswith("archive: expected member paths") and "../evil.py" in msgs["bad member"]
    assert msgs["both"].startswith("archive: expected either archive or src")
    assert "variant" in msgs["unknown variant"] and "qemu-tdx" in msgs["unknown variant"]
    assert msgs["no EK CA"].startswith("ek_ca_path:")
    assert msgs["bad key"].startswith("priv_key_file: expected a PEM ECDSA P-256 private key")
    assert msgs["another key"].startswith("priv_key_file: expected the key whose public half measurements_pub_key_file")
    assert msgs["signed without a key"].startswith("priv_key_file: expected the signing key")
    assert msgs["bad name"].startswith("name: expected an agent name")
    assert msgs["retire nothing named"].startswith("name: expected the agent to retire")
    assert state(inv) == before


def test_an_altered_or_unsigned_document_is_not_signed(inv):
    doc = inv / "measurements.json"
    doc.write_text(doc.read_text().replace("ab", "cd", 1))  # its signature no longer verifies
    before = state(inv)
    run, res = play(inv, [task("add", name="0.3.0", priv_key_file="measurements.key", ignore_errors=True)])
    assert run.ok, run.stdout
    assert res["add"]["failed"] and "does not verify" in res["add"]["msg"] and str(doc) in res["add"]["msg"]
    assert state(inv) == before
    (inv / "measurements.json.sig").unlink()  # unsigned, where a key is pinned: not signed now either
    run, res = play(inv, [task("add", name="0.3.0", priv_key_file="measurements.key", ignore_errors=True)])
    assert res["add"]["failed"] and res["add"]["msg"].startswith("measurements_file: expected a document signed with")
    assert doc.read_bytes() == before[0] and not (inv / "measurements.json.sig").exists()


def _tar(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def site_step(inv, *args):
    """site.yml's step 1 for the document (playbooks/tasks/agent_entry.yml with its variables), on the controller;
    the play's folder holds a galaxy.yml, as site.yml's does."""
    (inv / "galaxy.yml").write_text("namespace: constellation\nname: cluster\nversion: 9.8.7\n")
    defaults = {"group/constellation.cluster.attestation": {
        "variant": "qemu-vtpm-ek", "ek_ca_path": "ek_ca.pem", "measurements_file": "measurements.json",
        "measurements_pub_key_file": "measurements.pub"}}
    play = {"module_defaults": defaults, "vars_files": [str(ROOT / "playbooks" / "vars" / "agent_entry.yml")],
            "vars": {"constellation_measurements_file": "measurements.json"}}
    tasks = [{"name": "step 1", "ansible.builtin.import_tasks": str(ROOT / "playbooks" / "tasks" / "agent_entry.yml")}]
    run = run_tasks(inv, tasks, args, play=play, cwd=inv)
    assert run.ok, run.stdout
    return run


def test_site_without_the_key_warns_once_with_the_entry_and_changes_nothing(inv):
    before = state(inv)
    run = site_step(inv)
    said = [e["event_data"]["res"]["msg"] for e in run.events if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == WARNING]
    assert len(said) == 1 and said[0].startswith("[WARNING] measurements.json lists no agent")
    assert "constellation_measurements_signing_priv_key_file" in said[0]
    assert json.dumps({"9.8.7": expected(inv).to_dict()}) in said[0]
    assert state(inv) == before and run.changed() == 0


def test_site_with_the_key_lists_the_collection_s_agent_once(inv):
    key = ["-e", "constellation_measurements_signing_priv_key_file=%s" % (inv / "measurements.key")]
    first = site_step(inv, *key)
    assert first.changed() == 1 and first.results()[WARNING]["skipped"]
    pub = signature.load_public_key_file(str(inv / "measurements.pub"))
    doc = json.loads(signature.read_signed_file(str(inv / "measurements.json"), pub))
    assert doc["agents"] == {"9.8.7": expected(inv).to_dict()} and doc["version"] == 1
    again = site_step(inv, *key)
    assert again.changed() == 0
    named = site_step(inv, *key, "-e", "constellation_agent_name=next")  # the variable names it
    assert named.changed() == 1
    doc = json.loads(signature.read_signed_file(str(inv / "measurements.json"), pub))
    assert sorted(doc["agents"]) == ["9.8.7", "next"] and doc["version"] == 2
    assert site_step(inv).results()[WARNING]["skipped"]  # the document lists agents: nothing to say


def test_a_yaml_document_unsigned_is_signed_and_written_as_json(inv):
    (inv / "policy.yml").write_text("4:\n  expected: %s\n  warnOnly: false\n" % ("ab" * 32))
    # No key pinned (no module_defaults here): the signing key alone decides.
    run = run_tasks(inv, [task("add", name="0.3.0", priv_key_file="measurements.key", measurements_file="policy.yml",
                               variant="qemu-vtpm-ek", ek_ca_path="ek_ca.pem")], cwd=inv)
    assert run.ok, run.stdout
    res = run.results()
    assert res["add"]["changed"] and res["add"]["signature_file"] == str(inv / "policy.yml.sig")
    pub = signature.load_public_key_file(str(inv / "measurements.pub"))
    assert json.loads(signature.read_signed_file(str(inv / "policy.yml"), pub)) == {
        "version": 1, "accepted": {"default": PCRS}, "agents": {"0.3.0": expected(inv).to_dict()}}
