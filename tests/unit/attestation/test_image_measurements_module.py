# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image_measurements module through ansible-playbook (its action plugin, on the controller): a real UKI's
predicted document written and signed, idempotent, in check mode; an upgrade document over the signed one in force;
bad input refused naming the option, the files left as they were."""

from __future__ import annotations

import json

from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import image_prediction as ip
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import IMAGE_MEASUREMENTS_ARGS
from ansible_collections.constellation.cluster.tests.support.keys import measurements_key
from ansible_collections.constellation.cluster.tests.unit.attestation.ukis import CMDLINE, build_uki, skip_without_stub
from tests.support.playbook import run_tasks

pytestmark = skip_without_stub


def task(title, **options):
    extra = {k: options.pop(k) for k in ("check_mode", "ignore_errors") if k in options}
    return dict({"name": title, "constellation.cluster.image_measurements": options}, **extra)


def results(tmp_path, *tasks):
    """{task name: result}, in the tasks' order."""
    out = run_tasks(tmp_path, list(tasks), cwd=tmp_path).results()
    return [out[t["name"]] for t in tasks]


def test_firmware_choices_are_the_cores_profiles():
    assert IMAGE_MEASUREMENTS_ARGS["firmware"]["choices"] == list(ip.FIRMWARE_PROFILES)


def test_writes_the_signed_document_idempotently_and_an_upgrade_over_it(tmp_path):
    key = measurements_key(tmp_path / "measurements.pub")
    (tmp_path / "measurements.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    build_uki(tmp_path, "v1.efi")
    build_uki(tmp_path, "v2.efi", cmdline=CMDLINE.replace("ab", "cd").encode("ascii"))
    signing = {"priv_key_file": "measurements.key", "pub_key_file": "measurements.pub"}
    first = task("v1", uki="v1.efi", name="image-v1", dest="measurements.json", **signing)
    first_again = task("v1 again", uki="v1.efi", name="image-v1", dest="measurements.json", **signing)
    checked = task("v2 in check mode", uki="v2.efi", name="image-v2", base_file="measurements.json",
                   dest="upgrade.json", check_mode=True, **signing)
    upgrade = task("v2", uki="v2.efi", name="image-v2", base_file="measurements.json", dest="upgrade.json", **signing)
    upgrade_again = dict(upgrade, name="v2 again")
    made, again, dry, upgraded, upgraded_again = results(tmp_path, first, first_again, checked, upgrade, upgrade_again)
    assert made["changed"] and not again["changed"] and dry["changed"] and upgraded["changed"]
    assert not upgraded_again["changed"]
    expected = ip.predict(str(tmp_path / "v1.efi"))
    assert made["pcrs"] == {str(i): v.hex() for i, v in expected.values().items()}
    assert made["prediction"]["pcrs"]["7"]["events"][0]["type"] == "EV_EFI_VARIABLE_DRIVER_CONFIG"
    pub = signature.load_public_key_file(str(tmp_path / "measurements.pub"))
    in_force = signature.read_signed_file(str(tmp_path / "measurements.json"), pub)
    assert in_force.decode("utf-8") == ip.document(expected, "image-v1").dumps()
    doc = json.loads(signature.read_signed_file(str(tmp_path / "upgrade.json"), pub))
    assert doc["version"] == 1 and list(doc["accepted"]) == ["image-v1", "image-v2"]
    assert upgraded["sets"] == ["image-v1", "image-v2"] and upgraded["version"] == 1


def test_bad_input_is_refused_by_name_and_changes_nothing(tmp_path):
    key = measurements_key(tmp_path / "measurements.pub")
    other = measurements_key(tmp_path / "other.pub")
    for name, k in (("measurements.key", key), ("other.key", other)):
        (tmp_path / name).write_bytes(k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    build_uki(tmp_path, "v1.efi")
    (tmp_path / "not-a-uki.efi").write_bytes(b"MZ" + bytes(100))
    (tmp_path / "base.json").write_text('{"accepted": {"old": {"4": {"expected": "%s", "warnOnly": false}}}}\n'
                                        % ("11" * 32))
    (tmp_path / "base.json.sig").write_text(signature.sign_blob(other, (tmp_path / "base.json").read_bytes()) + "\n")
    (tmp_path / "dest.json").write_text("old\n")
    (tmp_path / "dest.json.sig").write_text("old\n")
    tasks = [
        task("not a UKI", uki="not-a-uki.efi", name="v1", dest="dest.json", priv_key_file="measurements.key",
             ignore_errors=True),
        task("a bad set name", uki="v1.efi", name="v 1", dest="dest.json", priv_key_file="measurements.key",
             ignore_errors=True),
        task("another signing key", uki="v1.efi", name="v1", dest="dest.json", priv_key_file="other.key",
             pub_key_file="measurements.pub", ignore_errors=True),
        task("a base signed by another key", uki="v1.efi", name="v1", dest="dest.json", base_file="base.json",
             priv_key_file="measurements.key", pub_key_file="measurements.pub", ignore_errors=True),
        task("unsigned over a signature", uki="v1.efi", name="v1", dest="dest.json", ignore_errors=True),
    ]
    runs = results(tmp_path, *tasks)
    messages = [r["msg"] for r in runs]
    assert all(r["failed"] and not r["changed"] for r in runs), runs
    assert "a PE/COFF image" in messages[0] and "Traceback" not in messages[0]
    assert messages[1].startswith("name: expected image set names")
    assert messages[2].startswith("priv_key_file: expected the key whose public half pub_key_file pins")
    assert "does not verify" in messages[3]
    assert messages[4].startswith("priv_key_file: expected the signing key")
    assert (tmp_path / "dest.json").read_text() == "old\n" and (tmp_path / "dest.json.sig").read_text() == "old\n"
