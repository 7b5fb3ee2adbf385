"""x509compat: the fallbacks for Debian 12's cryptography 38 behave as the library's own calls
(run here with a newer cryptography, calling the fallbacks directly)."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils import x509compat


def _cert(subject_key, issuer_key, subject="leaf", issuer="root", days=(-1, 1)):
    now = datetime.datetime.now(datetime.timezone.utc)
    algorithm = None if isinstance(issuer_key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(subject_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=days[0]))
            .not_valid_after(now + datetime.timedelta(days=days[1]))
            .sign(issuer_key, algorithm))


@pytest.mark.parametrize("make_key", [
    lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
    lambda: ec.generate_private_key(ec.SECP256R1()),
    ed25519.Ed25519PrivateKey.generate,
], ids=["rsa", "ecdsa", "ed25519"])
def test_signature_fallback_accepts_the_issuer_and_refuses_others(make_key):
    root_key, other_key, leaf_key = make_key(), make_key(), make_key()
    root = _cert(root_key, root_key, subject="root")
    leaf = _cert(leaf_key, root_key)
    x509compat.verify_signature_of(leaf, root)
    leaf.verify_directly_issued_by(root)  # the library agrees
    impostor = _cert(other_key, other_key, subject="root")  # same name, other key
    with pytest.raises(InvalidSignature):
        x509compat.verify_signature_of(leaf, impostor)
    with pytest.raises(InvalidSignature):
        leaf.verify_directly_issued_by(impostor)
    with pytest.raises(ValueError, match="issuer name"):
        x509compat.verify_signature_of(leaf, _cert(root_key, root_key, subject="elsewhere"))


def test_pem_bundle_fallback_reads_every_certificate_and_refuses_none():
    key = ec.generate_private_key(ec.SECP256R1())
    certs = [_cert(key, key, subject="a"), _cert(key, key, subject="b")]
    bundle = b"comment line\n" + b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
    assert x509compat.load_pem_certificates_each(bundle) == certs
    assert x509compat.load_pem_certificates(bundle) == certs
    with pytest.raises(ValueError):
        x509compat.load_pem_certificates_each(b"no certificate here")


def test_validity_is_timezone_aware_utc():
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(key, key, days=(-2, 3))
    before, after = x509compat.not_valid_before(cert), x509compat.not_valid_after(cert)
    assert before.tzinfo is not None and after.tzinfo is not None
    assert before == cert.not_valid_before_utc and after == cert.not_valid_after_utc


SYSTEM_PYTHON = "/usr/bin/python3"


def _system_cryptography():
    import subprocess

    try:
        out = subprocess.run([SYSTEM_PYTHON, "-c", "import cryptography; print(cryptography.__version__)"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(int(part) for part in out.strip().split(".")[:2])


def test_every_variant_attests_on_debians_cryptography():
    """Every variant's OID goes into an aTLS certificate on Debian 12's python3-cryptography (38) and comes
    back out, and the agent's configuration takes the default variant there. A certificate with the UUID
    OID of a 0.2.0 checkout, which cryptography before 44 cannot parse, is refused as not valid X.509:
    there the alias is unused."""
    import datetime
    import json
    import subprocess
    from pathlib import Path

    from ansible_collections.constellation.cluster.plugins.module_utils import atls
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose

    version = _system_cryptography()
    if version is None:
        pytest.skip("no %s with python3-cryptography (make setup installs it)" % SYSTEM_PYTHON)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    old = atls.build_certificate(key, [(choose.QEMU_VTPM_EK_OLD_OID, b"a 0.2.0 document")],
                                 now - datetime.timedelta(minutes=5), now + datetime.timedelta(hours=1))
    collections = str(Path(__file__).resolve().parents[2] / "collections")
    probe = (
        "import datetime, json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import cryptography\n"
        "from cryptography import x509\n"
        "from cryptography.hazmat.primitives.asymmetric import ec\n"
        "from ansible_collections.constellation.cluster.plugins.module_utils import atls\n"
        "from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig\n"
        "from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose\n"
        "from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError\n"
        "now = datetime.datetime.now(datetime.timezone.utc)\n"
        "out = {'version': cryptography.__version__, 'path': cryptography.__file__, 'oids': {}}\n"
        "for name in choose.names():\n"
        "    cert = atls.build_certificate(ec.generate_private_key(ec.SECP256R1()), [(choose.spec(name).oid, b'doc')],\n"
        "                                  now, now + datetime.timedelta(hours=1))\n"
        "    cert = x509.load_der_x509_certificate(cert.public_bytes(atls.serialization.Encoding.DER))\n"
        "    out['oids'][name] = [ext.oid.dotted_string for ext in cert.extensions]\n"
        "AgentConfig.from_mapping({'state_dir': '/nonexistent', 'public_endpoint': '10.0.0.1:9000',\n"
        "                          'variant': 'qemu-vtpm-ek', 'measurements': 'm.json', 'ek_ca': 'ca.pem',\n"
        "                          'init_secret_hash': 'ab' * 32, 'measurements_pub_key': 'measurements.pub'})\n"
        "try:\n"
        "    atls.verify_peer_certificate(bytes.fromhex(sys.argv[2]), [], b'n' * 32)\n"
        "except AttestationError as err:\n"
        "    out['old'] = str(err)\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([SYSTEM_PYTHON, "-I", "-c", probe, collections,
                           old.public_bytes(serialization.Encoding.DER).hex()],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["path"].startswith("/usr/lib/python3/dist-packages/")
    assert result["oids"] == {name: [choose.spec(name).oid] for name in choose.names()}
    if version < (44, 0):
        assert result["old"].startswith("peer certificate is not valid X.509")
    else:
        assert "no attestation of an accepted variant" in result["old"]
