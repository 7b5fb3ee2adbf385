# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD's certificates at hand (docs/attestation.md, "Certificates at hand"): the ``amd_cert_cache`` folder named by
product, chip_id and TCB, and ``amd_kds_fetch`` against a loopback HTTP server standing for AMD's KDS (never the
real one): the KDS's URLs, one fetch per certificate (then the cache), and every failure naming what is missing."""

from __future__ import annotations

import datetime
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.amd_certs import (
    CertCache,
    CertificateMissing,
    certs_for_report,
    tcb_name,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from ansible_collections.constellation.cluster.tests.support.loopback import LoopbackServer
from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as snp_vectors

CHIP_ID = bytes(range(1, 65))
TCB = SimpleNamespace(bootloader=3, tee=0, snp=8, microcode=115, fmc=None)
TURIN_TCB = SimpleNamespace(bootloader=1, tee=0, snp=3, microcode=72, fmc=2)
MILAN_NAME = "vcek-%s-blSPL3-teeSPL0-snpSPL8-ucodeSPL115.der" % CHIP_ID.hex()


def _cert(name: str) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA384()))


VCEK = _cert("SEV-VCEK").public_bytes(Encoding.DER)
CHAIN = _cert("SEV-Milan").public_bytes(Encoding.PEM) + _cert("ARK-Milan").public_bytes(Encoding.PEM)


class FakeKDS(LoopbackServer):
    """A loopback HTTP server standing for kdsintf.amd.com: ``routes`` maps a path with its query to
    (status, body); every request's path is recorded."""

    def __init__(self, routes):
        self.routes = routes
        self.requests = []
        self.lock = threading.Lock()
        super().__init__()
        self.url = "http://%s" % self.endpoint

    def serve(self, sock):
        kds = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802  (http.server's name)
                with kds.lock:
                    kds.requests.append(self.path)
                status, body = kds.routes.get(self.path, (404, b"not found"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        try:
            Handler(sock, sock.getpeername(), None)
        finally:
            sock.close()


@pytest.fixture(name="kds")
def fixture_kds():
    server = FakeKDS({
        "/vcek/v1/Milan/%s?blSPL=3&teeSPL=0&snpSPL=8&ucodeSPL=115" % CHIP_ID.hex(): (200, VCEK),
        "/vcek/v1/Turin/%s?fmcSPL=2&blSPL=1&teeSPL=0&snpSPL=3&ucodeSPL=72" % CHIP_ID[:8].hex(): (200, VCEK),
        "/vcek/v1/Milan/cert_chain": (200, CHAIN),
        "/vlek/v1/Genoa/cert_chain": (200, CHAIN),
    })
    yield server
    server.close()


def test_a_cached_vcek_is_found_by_product_chip_id_and_tcb_without_fetching(tmp_path):
    (tmp_path / "Milan").mkdir()
    (tmp_path / "Milan" / MILAN_NAME).write_bytes(VCEK)
    assert CertCache(str(tmp_path)).vcek("Milan", CHIP_ID, TCB) == VCEK


def test_a_pem_in_the_cache_serves_as_well(tmp_path):
    (tmp_path / "Milan").mkdir()
    pem = x509.load_der_x509_certificate(VCEK).public_bytes(Encoding.PEM)
    (tmp_path / "Milan" / MILAN_NAME.replace(".der", ".pem")).write_bytes(pem)
    assert CertCache(str(tmp_path)).vcek("Milan", CHIP_ID, TCB) == VCEK


def test_without_kds_fetch_a_missing_vcek_names_the_chip_the_tcb_and_the_file(tmp_path, kds):
    cache = CertCache(str(tmp_path), kds_url=kds.url)
    with pytest.raises(CertificateMissing) as err:
        cache.vcek("Milan", CHIP_ID, TCB)
    message = str(err.value)
    assert "VCEK of chip_id %s at TCB blSPL3-teeSPL0-snpSPL8-ucodeSPL115 (Milan)" % CHIP_ID.hex() in message
    assert os.path.join(str(tmp_path), "Milan", MILAN_NAME) in message and "amd_kds_fetch: true" in message
    assert not kds.requests


def test_another_tcb_is_another_certificate(tmp_path):
    (tmp_path / "Milan").mkdir()
    (tmp_path / "Milan" / MILAN_NAME).write_bytes(VCEK)
    lower = SimpleNamespace(bootloader=3, tee=0, snp=8, microcode=114, fmc=None)
    with pytest.raises(CertificateMissing, match="at TCB blSPL3-teeSPL0-snpSPL8-ucodeSPL114 "):
        CertCache(str(tmp_path)).vcek("Milan", CHIP_ID, lower)


def test_kds_fetch_asks_the_kds_once_then_the_cache_answers(tmp_path, kds):
    cache = CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url)
    assert cache.vcek("Milan", CHIP_ID, TCB) == VCEK
    assert (tmp_path / "Milan" / MILAN_NAME).read_bytes() == VCEK
    assert CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url).vcek("Milan", CHIP_ID, TCB) == VCEK
    assert kds.requests == ["/vcek/v1/Milan/%s?blSPL=3&teeSPL=0&snpSPL=8&ucodeSPL=115" % CHIP_ID.hex()]


def test_turin_is_named_by_8_bytes_of_chip_id_and_its_fmc_level(tmp_path, kds):
    cache = CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url)
    assert cache.vcek("Turin", CHIP_ID, TURIN_TCB) == VCEK
    name = "vcek-%s-fmcSPL2-blSPL1-teeSPL0-snpSPL3-ucodeSPL72.der" % CHIP_ID[:8].hex()
    assert (tmp_path / "Turin" / name).exists()
    with pytest.raises(InputError, match=r"^tcb.fmc: expected Turin's FMC security patch level"):
        cache.vcek("Turin", CHIP_ID, TCB)


def test_product_chains_are_fetched_and_cached(tmp_path, kds):
    cache = CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url)
    assert cache.cert_chain("Milan") == CHAIN
    assert cache.cert_chain("Genoa", "vlek") == CHAIN
    assert cache.cert_chain("Milan") == CHAIN
    assert (tmp_path / "Milan" / "cert_chain.pem").read_bytes() == CHAIN
    assert (tmp_path / "Genoa" / "vlek_cert_chain.pem").read_bytes() == CHAIN
    assert kds.requests == ["/vcek/v1/Milan/cert_chain", "/vlek/v1/Genoa/cert_chain"]


def test_a_vlek_comes_from_the_cache_only(tmp_path, kds):
    cache = CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url)
    with pytest.raises(CertificateMissing, match=r"^VLEK at TCB blSPL3-teeSPL0-snpSPL8-ucodeSPL115 \(Genoa\): "
                                                 r"not in the report's certificates nor in amd_cert_cache"):
        cache.vlek("Genoa", TCB)
    assert not kds.requests
    (tmp_path / "Genoa").mkdir()
    (tmp_path / "Genoa" / "vlek-blSPL3-teeSPL0-snpSPL8-ucodeSPL115.der").write_bytes(VCEK)
    assert cache.vlek("Genoa", TCB) == VCEK


def test_a_kds_error_names_the_status_and_nothing_is_cached(tmp_path, kds):
    kds.routes["/vcek/v1/Genoa/%s?blSPL=3&teeSPL=0&snpSPL=8&ucodeSPL=115" % CHIP_ID.hex()] = (429, b"slow down")
    cache = CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url)
    with pytest.raises(CertificateMissing, match=r"^amd_kds_fetch: VCEK of chip_id [0-9a-f]{128} at TCB .*"
                                                 r"answered HTTP 429 .*try again later"):
        cache.vcek("Genoa", CHIP_ID, TCB)
    with pytest.raises(CertificateMissing, match=r"answered HTTP 404"):
        cache.vcek("Milan", bytes(63) + b"\x01", TCB)
    assert not any(files for _dir, _subdirs, files in os.walk(str(tmp_path)))


@pytest.mark.parametrize("body,message", [
    (b"<html>maintenance</html>", r"expected an X.509 certificate \(DER or PEM\), got 24 bytes that do not parse"),
    (b"\x30" * (64 * 1024 + 1), r"expected at most 65536 bytes"),
])
def test_a_reply_that_is_no_certificate_is_refused_and_not_cached(tmp_path, kds, body, message):
    kds.routes["/vcek/v1/Milan/%s?blSPL=3&teeSPL=0&snpSPL=8&ucodeSPL=115" % CHIP_ID.hex()] = (200, body)
    with pytest.raises(AttestationError, match=message):
        CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url).vcek("Milan", CHIP_ID, TCB)
    assert not (tmp_path / "Milan" / MILAN_NAME).exists()


def test_a_chain_reply_that_is_not_two_certificates_is_refused(tmp_path, kds):
    kds.routes["/vcek/v1/Milan/cert_chain"] = (200, CHAIN.split(b"-----END CERTIFICATE-----")[0]
                                               + b"-----END CERTIFICATE-----\n")
    with pytest.raises(AttestationError, match=r"expected AMD's product chain of 2 certificates .*got 1"):
        CertCache(str(tmp_path), kds_fetch=True, kds_url=kds.url).cert_chain("Milan")
    assert not (tmp_path / "Milan" / "cert_chain.pem").exists()


def test_an_unreachable_kds_is_named(tmp_path):
    probe = socket.create_server(("127.0.0.1", 0))  # a port nobody listens on: take one and close it
    port = probe.getsockname()[1]
    probe.close()
    cache = CertCache(str(tmp_path), kds_fetch=True, kds_url="http://127.0.0.1:%d" % port, timeout=2)
    with pytest.raises(CertificateMissing, match=r"^amd_kds_fetch: AMD's ASK chain for Milan: AMD's KDS at "
                                                 r"http://127.0.0.1:\d+/vcek/v1/Milan/cert_chain could not be reached"):
        cache.cert_chain("Milan")


@pytest.mark.parametrize("kwargs,message", [
    ({"folder": None, "kds_fetch": True}, r"^amd_cert_cache: expected a folder to keep what amd_kds_fetch fetches"),
    ({"folder": "/tmp", "kds_fetch": "yes"}, r"^amd_kds_fetch: expected true or false, got 'yes'"),
    ({"folder": "/tmp", "kds_url": "http://kds.example"}, r"^kds_url: expected an https:// URL"),
    ({"folder": ""}, r"^amd_cert_cache: expected the path of a folder"),
])
def test_bad_settings_are_refused_naming_them(kwargs, message):
    with pytest.raises(InputError, match=message):
        CertCache(**kwargs)


def test_a_file_is_no_cache_folder(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"")
    with pytest.raises(InputError, match=r"^amd_cert_cache: expected a folder"):
        CertCache(str(path))


def test_without_a_cache_folder_the_message_says_so():
    with pytest.raises(CertificateMissing, match=r"not in the report's certificates and no amd_cert_cache is set"):
        CertCache(None).cert_chain("Turin")


@pytest.mark.parametrize("call,message", [
    (lambda c: c.vcek("Milan", bytes(64), TCB), r"^chip_id: expected a chip_id \(the report masks it"),
    (lambda c: c.vcek("Milan", b"\x01" * 63, TCB), r"^chip_id: expected 64 bytes"),
    (lambda c: c.vcek("Naples", CHIP_ID, TCB), r"^product: expected one of Milan, Genoa, Turin, got 'Naples'"),
    (lambda c: c.vcek("Milan", CHIP_ID, {"bootloader": 3, "tee": 0, "snp": 256, "microcode": 1}),
     r"^tcb.snpSPL: expected a security patch level 0..255, got 256"),
    (lambda c: c.cert_chain("Milan", "ark"), r"^signing_key: expected vcek or vlek, got 'ark'"),
])
def test_bad_questions_are_refused_naming_the_field(tmp_path, call, message):
    with pytest.raises(InputError, match=message):
        call(CertCache(str(tmp_path)))


def test_tcb_names_follow_the_kds_parameters():
    assert tcb_name(TCB, "Milan") == "blSPL3-teeSPL0-snpSPL8-ucodeSPL115"
    assert tcb_name({"bootloader": 1, "tee": 0, "snp": 3, "microcode": 72, "fmc": 2}, "Turin") == \
        "fmcSPL2-blSPL1-teeSPL0-snpSPL3-ucodeSPL72"


# --- real reports: a cache filled with AMD's real certificates serves them to verify_report ----------------------


def _real_cache(tmp_path, vector, product="Milan"):
    report = sev_snp.parse_report(vector.report)
    folder = tmp_path / product
    folder.mkdir(parents=True, exist_ok=True)
    if vector.kind == "vcek":
        name = "vcek-%s-%s.der" % (report.chip_id.hex(), tcb_name(report.reported_tcb, product))
        (folder / "cert_chain.pem").write_bytes(vector.chain)
    else:
        name = "vlek-%s.der" % tcb_name(report.reported_tcb, product)
        (folder / "vlek_cert_chain.pem").write_bytes(vector.chain)
    (folder / name).write_bytes(vector.signer)  # go-sev-guest's VCEK: DER with AMD's serial number zero
    return report


@pytest.mark.parametrize("name", ["go-sev-guest", "aws"])
def test_a_real_report_verifies_with_the_certificates_from_the_cache(tmp_path, name, recwarn):
    vector = snp_vectors.vector(name)
    report = _real_cache(tmp_path, vector)
    signer, chain = certs_for_report(report, CertCache(str(tmp_path)))
    verified = sev_snp.verify_report(report, signer, chain, now=vector.now)
    assert verified.signing_key == vector.kind and verified.product == "Milan"
    assert not [w for w in recwarn if "serial" in str(w.message)]


def test_a_planted_vcek_of_another_chip_is_refused_by_the_verifier_not_trusted(tmp_path):
    """The cache is not trusted: Azure's genuine VCEK filed under go-sev-guest's chip_id and TCB fails."""
    vector = snp_vectors.vector("go-sev-guest")
    report = _real_cache(tmp_path, vector)
    name = "vcek-%s-%s.der" % (report.chip_id.hex(), tcb_name(report.reported_tcb, "Milan"))
    (tmp_path / "Milan" / name).write_bytes(snp_vectors.read("constellation-azure/vcek.cert"))
    signer, chain = certs_for_report(report, CertCache(str(tmp_path)))
    with pytest.raises(sev_snp.SNPError):
        sev_snp.verify_report(report, signer, chain, now=vector.now)


def test_a_report_whose_vcek_is_missing_is_named_by_its_chip_id_and_reported_tcb(tmp_path):
    report = sev_snp.parse_report(snp_vectors.vector("go-sev-guest").report)
    with pytest.raises(CertificateMissing) as err:
        certs_for_report(report, CertCache(str(tmp_path)))
    assert "VCEK of chip_id %s at TCB %s (Milan)" % (report.chip_id.hex(), tcb_name(report.reported_tcb, "Milan")) \
        in str(err.value)
