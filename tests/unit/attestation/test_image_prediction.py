# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node image's PCR prediction (attestation/image_prediction.py) on real UKIs built here with objcopy from
Debian's systemd-stub: the Authenticode digests against osslsigncode's, PCRs 4, 7, 9 and 11 against values derived
by hand, PCR 11 against systemd-measure, malformed PE refused by name, and the signed document loaded by the
policy loader every attestation action uses."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import image_prediction as ip
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import (
    agent_measurement, policy, signature)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    MeasurementSets, MeasurementsMismatch, parse_policy)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.tests.support.keys import measurements_key
from ansible_collections.constellation.cluster.tests.unit.attestation.ukis import (
    CMDLINE, INITRD, KERNEL_PE, OSREL, STUB, build_uki, skip_without_stub)

pytestmark = skip_without_stub
STUB_BYTES = open(STUB, "rb").read() if os.path.exists(STUB) else b""


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def extend_all(digests) -> bytes:
    value = bytes(32)
    for digest in digests:
        value = sha256(value + digest)
    return value


def osslsigncode_digest(path, tmp_path) -> bytes:
    """The Authenticode SHA-256 digest osslsigncode puts into the SpcIndirectDataContent it would sign. It pads
    the file to a multiple of 8 bytes first (a certificate table must be aligned); the firmware does not."""
    out = tmp_path / "indirect.der"
    if out.exists():
        out.unlink()  # osslsigncode does not overwrite
    subprocess.run(["osslsigncode", "extract-data", "-h", "sha256", "-in", str(path), "-out", str(out)],
                   check=True, capture_output=True)
    der = out.read_bytes()
    # The digest is the last OCTET STRING of 32 bytes: DigestInfo { AlgorithmIdentifier sha256, OCTET STRING }.
    marker = der.rfind(b"\x04\x20")
    assert marker > 0, der.hex()
    return der[marker + 2:marker + 34]


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 8)


needs_osslsigncode = pytest.mark.skipif(not shutil.which("osslsigncode"), reason="osslsigncode is not installed "
                                        "(scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def uki(tmp_path_factory):
    return build_uki(tmp_path_factory.mktemp("uki"))


@pytest.fixture(scope="module")
def prediction(uki):
    return ip.predict(uki)


# --- Authenticode ----------------------------------------------------------------------------------------------


@needs_osslsigncode
def test_authenticode_digest_matches_osslsigncode(tmp_path, uki):
    for path in (uki, STUB, KERNEL_PE):
        data = open(path, "rb").read()
        copy = tmp_path / "aligned.efi"
        copy.write_bytes(padded(data))
        assert ip.authenticode_digest(padded(data)) == osslsigncode_digest(copy, tmp_path), path
        assert ip.authenticode_digest(padded(data)) == osslsigncode_digest(path, tmp_path), path


def digest_by_hand(data: bytes) -> bytes:
    """What edk2's measured boot hashes for a PE32+ image, derived here from the headers: CheckSum and the
    Certificate Table entry skipped, the sections by file offset, then the bytes after them as they are."""
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    sections, optional_size = struct.unpack_from("<H", data, pe + 6)[0], struct.unpack_from("<H", data, pe + 20)[0]
    optional = pe + 24
    assert struct.unpack_from("<H", data, optional)[0] == 0x20B  # PE32+
    checksum, cert_entry = optional + 64, optional + 112 + 4 * 8
    headers = struct.unpack_from("<I", data, optional + 60)[0]
    table = optional + optional_size
    raw = sorted(struct.unpack_from("<II", data, table + 40 * i + 16)[::-1] for i in range(sections))
    body = b"".join(data[pointer:pointer + size] for pointer, size in raw if size)
    hashed = headers + sum(size for _pointer, size in raw)
    return sha256(data[:checksum] + data[checksum + 4:cert_entry] + data[cert_entry + 8:headers] + body
                  + data[hashed:])


def test_authenticode_digest_by_hand_hashes_trailing_data_unpadded(uki):
    """objcopy leaves a symbol table after the sections, and the UKI's length is no multiple of 8: the firmware
    hashes that tail as it is (no padding)."""
    data = open(uki, "rb").read()
    assert len(data) % 8
    assert ip.authenticode_digest(data) == digest_by_hand(data)
    assert ip.authenticode_digest(data) != ip.authenticode_digest(padded(data))


def test_authenticode_digest_excludes_a_certificate_table(uki):
    """A signed image: the digest leaves out the certificate table at the end (and its directory entry)."""
    data = bytearray(padded(open(uki, "rb").read()))
    unsigned = ip.authenticode_digest(bytes(data))
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    cert_entry = pe + 24 + 112 + 4 * 8
    certificate = struct.pack("<IHH", 16, 0x0200, 0x0002) + b"\x30\x82" + bytes(6)
    struct.pack_into("<II", data, cert_entry, len(data), len(certificate))
    assert ip.authenticode_digest(bytes(data) + certificate) == unsigned


# --- PCRs ------------------------------------------------------------------------------------------------------


@needs_osslsigncode
def test_pcr4_known_answer(tmp_path, uki, prediction):
    """The boot manager's action string, the separator (a UINT32 0), the UKI, the kernel the stub loads."""
    uki_data = open(uki, "rb").read()
    kernel = open(KERNEL_PE, "rb").read()
    aligned = tmp_path / "uki-aligned.efi"
    aligned.write_bytes(padded(uki_data))
    kernel_copy = tmp_path / "kernel.efi"
    kernel_copy.write_bytes(padded(kernel))
    assert ip.authenticode_digest(padded(kernel)) == osslsigncode_digest(kernel_copy, tmp_path)
    events = [sha256(b"Calling EFI Application from Boot Option"), sha256(b"\x00\x00\x00\x00"),
              digest_by_hand(uki_data), digest_by_hand(kernel)]
    assert [e.digest for e in prediction.pcrs[4].events] == events
    assert [e.type for e in prediction.pcrs[4].events] == [
        "EV_EFI_ACTION", "EV_SEPARATOR", "EV_EFI_BOOT_SERVICES_APPLICATION", "EV_EFI_BOOT_SERVICES_APPLICATION"]
    assert prediction.values()[4] == extend_all(events)
    assert prediction.uki_authenticode == ip.authenticode_digest(uki_data)
    assert ip.authenticode_digest(padded(uki_data)) == osslsigncode_digest(aligned, tmp_path)


def test_pcr9_known_answer(prediction):
    """The Linux EFI stub measures its load options (the command line, UTF-16LE with the NUL) and the initrd."""
    options = CMDLINE.encode("utf-16-le") + b"\x00\x00"
    events = [sha256(options), sha256(INITRD)]
    assert [e.digest for e in prediction.pcrs[9].events] == events
    assert prediction.values()[9] == extend_all(events)
    assert prediction.cmdline == CMDLINE


def test_pcr11_known_answer_and_systemd_measure(uki, prediction):
    """Each section's name with NUL and its content, then the four boot phases; systemd-measure agrees (predict
    refuses to return otherwise) and so does this replay, derived by hand."""
    kernel = open(KERNEL_PE, "rb").read()
    cmdline = CMDLINE.encode("ascii")
    digests = []
    for name, content in ((".linux", kernel), (".osrel", OSREL), (".cmdline", cmdline), (".initrd", INITRD)):
        digests += [sha256(name.encode("ascii") + b"\x00"), sha256(content)]
    digests += [sha256(phase) for phase in (b"enter-initrd", b"leave-initrd", b"sysinit", b"ready")]
    assert prediction.values()[11] == extend_all(digests)
    sections = ip.uki_sections(open(uki, "rb").read())
    assert ip.measure_pcr11(sections)[0] == extend_all(digests)
    assert prediction.systemd_measure.startswith("systemd ")


def test_pcr7_known_answer_secure_boot_off(prediction):
    """SecureBoot (one byte 0) and the empty PK, KEK, db, dbx as UEFI_VARIABLE_DATA, then the separator. The
    value is the one published for OVMF with Secure Boot off and no keys (also AWS NitroTPM's)."""
    global_guid = bytes.fromhex("61dfe48bca93d211aa0d00e098032b8c")  # 8be4df61-93ca-11d2-aa0d-00e098032b8c
    db_guid = bytes.fromhex("cbb219d73a3d9645a3bcdad00e67656f")  # d719b2cb-3d3a-4596-a3bc-dad00e67656f

    def variable(guid, name, data=b""):
        return guid + struct.pack("<QQ", len(name), len(data)) + name.encode("utf-16-le") + data

    blobs = [variable(global_guid, "SecureBoot", b"\x00"), variable(global_guid, "PK"),
             variable(global_guid, "KEK"), variable(db_guid, "db"), variable(db_guid, "dbx")]
    events = prediction.pcrs[7].events
    assert [e.data for e in events[:-1]] == blobs
    assert [e.digest for e in events] == [sha256(blob) for blob in blobs] + [sha256(bytes(4))]
    assert {e.type for e in events[:-1]} == {"EV_EFI_VARIABLE_DRIVER_CONFIG"} and events[-1].type == "EV_SEPARATOR"
    assert prediction.values()[7].hex() == "65caf8dd1e0ea7a6347b635d2b379c93b9a1351edc2afc3ecda700e534eb3068"


def test_prediction_reports_what_it_depends_on(prediction):
    data = json.loads(json.dumps(prediction.to_dict()))
    assert data["stub"].startswith("systemd-stub ")
    assert data["firmware"] == {"name": "ovmf-2022.11", "secure_boot": False,
                                "description": ip.OVMF_2022_11.description}
    assert sorted(data["pcrs"], key=int) == ["4", "7", "9", "11"]
    for index, entry in data["pcrs"].items():
        assert ip.replay([ip.Event(int(index), e["type"], bytes.fromhex(e["digest"]), e["description"])
                          for e in entry["events"]]).hex() == entry["value"]


def test_a_changed_command_line_changes_pcrs_4_9_and_11_not_7(tmp_path, prediction):
    other = ip.predict(build_uki(tmp_path, cmdline=CMDLINE.replace("ttyS0", "ttyS1").encode("ascii")))
    changed = {index for index in ip.PREDICTED_PCRS if other.values()[index] != prediction.values()[index]}
    assert changed == {4, 9, 11}  # 4 too: the UKI file (and so its Authenticode digest) is another
    assert other.kernel_authenticode == prediction.kernel_authenticode


# --- malformed input -------------------------------------------------------------------------------------------


def refused(tmp_path, data: bytes, name="bad.efi") -> InputError:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(InputError) as err:
        ip.predict(str(path))
    return err.value


def test_refuses_what_is_not_a_pe(tmp_path):
    err = refused(tmp_path, b"\x7fELF" + bytes(200))
    assert "uki" in err.field and "PE/COFF image (an MZ header)" in str(err)
    err = refused(tmp_path, b"")
    assert "0 bytes" in str(err)


def test_refuses_truncated_and_out_of_bounds_pe(tmp_path, uki):
    data = open(uki, "rb").read()
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    assert "PE signature" in str(refused(tmp_path, data[:pe + 2]))
    assert "section table inside SizeOfHeaders" in str(refused(tmp_path, data[:0x300]))
    assert "inside the file after the headers" in str(refused(tmp_path, data[:len(data) // 2]))
    bent = bytearray(data)
    struct.pack_into("<I", bent, 0x3C, len(data) + 10)
    assert "PE signature at e_lfanew" in str(refused(tmp_path, bytes(bent)))
    bent = bytearray(data)
    struct.pack_into("<H", bent, pe + 24, 0x107)
    assert "optional header magic" in str(refused(tmp_path, bytes(bent)))


def test_refuses_a_stub_without_the_uki_sections(tmp_path):
    err = refused(tmp_path, open(STUB, "rb").read())
    assert "sections .linux, .osrel, .cmdline, .initrd" in str(err) and "no .linux" in str(err)
    err = refused(tmp_path, open(build_uki(tmp_path, drop=(".initrd",)), "rb").read())
    assert "no .initrd" in str(err)


def test_refuses_a_kernel_section_that_is_not_a_pe(tmp_path):
    err = refused(tmp_path, open(build_uki(tmp_path, linux=b"not a kernel" * 100), "rb").read())
    assert err.field.endswith(".linux") and "MZ header" in str(err)


def test_refuses_a_command_line_with_a_newline(tmp_path):
    err = refused(tmp_path, open(build_uki(tmp_path, cmdline=CMDLINE.encode("ascii") + b"\n"), "rb").read())
    assert err.field.endswith(".cmdline") and "without a newline" in str(err) and "0x0a" in str(err)


def test_refuses_a_missing_file(tmp_path):
    with pytest.raises(InputError, match="uki: expected a readable UKI file"):
        ip.predict(str(tmp_path / "absent.efi"))


# --- the signed document ---------------------------------------------------------------------------------------


def test_document_is_one_enforced_set_with_pcr13_zero(prediction):
    doc = ip.document(prediction, "debian-12-2026.11", version=3)
    data = json.loads(doc.dumps())
    assert data["version"] == 3 and list(data["accepted"]) == ["debian-12-2026.11"]
    entry = data["accepted"]["debian-12-2026.11"]
    assert sorted(entry, key=int) == ["4", "7", "9", "11", "13"]
    assert entry["13"] == {"expected": "00" * 32, "warnOnly": False}
    assert all(value["warnOnly"] is False for value in entry.values())
    pcrs = dict(prediction.values())
    pcrs[13] = bytes(32)
    assert doc.match(pcrs)[0] == "debian-12-2026.11"
    with pytest.raises(MeasurementsMismatch, match="PCR 13"):
        doc.match({**pcrs, 13: b"\x01" * 32})
    with pytest.raises(InputError, match="name"):
        ip.document(prediction, "bad name/")


def test_signed_document_loads_as_the_attestation_actions_load_it(tmp_path, prediction):
    """verify_attestation's measurements_file + measurements_pub_key_file (policy.load_policy) and the
    accepted sets upgrade_image.yml gives the Coordinator (parse_policy of the same file)."""
    key = measurements_key(tmp_path / "measurements.pub")
    path = str(tmp_path / "measurements.json")
    doc = ip.document(prediction, "image-v2", version=7)
    assert ip.write_signed(doc, path, key) == (path, path + ".sig")
    loaded = policy.load_policy(measurements_file=path, public_key_path=str(tmp_path / "measurements.pub"))
    assert loaded == doc and policy.enforced_pcrs(loaded) == [4, 7, 9, 11, 13]
    assert parse_policy(json.load(open(path, encoding="utf-8"))).sets == doc.sets
    signature.read_signed_file(path, signature.load_public_key_file(str(tmp_path / "measurements.pub")))
    # What verify_attestation compares (settings_from_args): the agents' rule keeps an image set's zero PCR 13.
    agent_value = sha256(b"a host-mode agent")
    compared = agent_measurement.enforce_agent_pcr(loaded, agent_value)
    image_peer = {**prediction.values(), 13: bytes(32)}
    assert compared.match(image_peer)[0] == "image-v2"
    with pytest.raises(MeasurementsMismatch, match="PCR 13"):
        compared.match({**image_peer, 13: agent_value})  # a host agent that extended PCR 13 on this boot chain
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(" ")
    with pytest.raises(InputError, match="does not verify"):
        policy.load_policy(measurements_file=path, public_key_path=str(tmp_path / "measurements.pub"))


def test_upgrade_document_keeps_the_running_sets_and_the_coordinator_takes_it(tmp_path, prediction):
    """upgrade_image.yml: the document in force plus the new image's set, version raised, signed; the Coordinator
    (SetMeasurements) checks it as core/accepted_measurements.check_document does: signature first, every set
    enforcing, no older version."""
    from ansible_collections.constellation.cluster.plugins.module_utils.core.accepted_measurements import check_document

    key = measurements_key(tmp_path / "measurements.pub")
    running = ip.document(prediction, "image-v1", version=4)
    new = ip.predict(build_uki(tmp_path, cmdline=CMDLINE.replace("ab", "cd").encode("ascii")))
    upgrade = ip.document(new, "image-v2", base=running)
    assert upgrade.version == 5 and list(upgrade.sets) == ["image-v1", "image-v2"]
    assert upgrade.sets["image-v1"] == running.sets["image-v1"]
    path = str(tmp_path / "measurements-upgrade.json")
    ip.write_signed(upgrade, path, key)
    data = open(path, "rb").read()
    sig = open(path + ".sig", encoding="ascii").read().strip()
    taken = check_document(data, sig, key.public_key(), current=running)
    assert taken == upgrade
    assert taken.match({**new.values(), 13: bytes(32)})[0] == "image-v2"
    assert taken.match({**prediction.values(), 13: bytes(32)})[0] == "image-v1"
    with pytest.raises(InputError, match="does not verify"):
        check_document(data.replace(b"image-v2", b"image-v3"), sig, key.public_key(), current=running)
    assert ip.document(new, "image-v2", base=upgrade) == MeasurementSets(upgrade.sets, 6)  # the same set again
    with pytest.raises(InputError, match="does not give other values"):
        ip.document(new, "image-v1", base=running)
    with pytest.raises(InputError, match="a version above the base document's 4"):
        ip.document(new, "image-v2", version=4, base=running)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(edits=st.lists(st.tuples(st.integers(0, 0x3FF), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.integers(0, 0x20000)))
def test_mutated_headers_give_a_digest_or_an_input_error(edits, cut):
    """Any byte of the headers changed, any length: a digest or an InputError, never another exception."""
    data = bytearray(STUB_BYTES)
    for offset, value in edits:
        data[offset] = value
    data = bytes(data[:cut] if cut is not None else data)
    for parse in (ip.authenticode_digest, ip.uki_sections, ip.stub_version):
        try:
            parse(data)
        except InputError as err:
            assert err.field == "uki" or err.field.startswith("uki ")


def test_a_missing_systemd_measure_is_named(uki):
    with pytest.raises(ConstellationError, match="/nonexistent/systemd-measure"):
        ip.predict(uki, systemd_measure="/nonexistent/systemd-measure")
