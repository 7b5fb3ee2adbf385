# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""aTLS handshake cost against plain TLS, measured in the same run on loopback.

Prints: plain TLS 1.3 handshake + 1 round trip (p50/p99); the same with aTLS against a real
swtpm (qemu-vtpm issuer, full client validation), once with the RSA-2048 AK (the default,
``ratio``/``atls_p50_ms``) and once with the ECC P-256 AK (``ak_alg: ecc``, ``ratio_ecc``/
``atls_ecc_p50_ms``), each interleaved with plain handshakes; validations per second of the
validator alone on a pre-made document; and where the server's time goes. The last line is one
JSON object. Bounded loops, loopback only, about a minute.

Usage: python bench/atls_handshake.py [--atls N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

from cryptography.hazmat.primitives.serialization import Encoding

sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "collections"),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
os.environ.setdefault("TSS2_LOG", "all+none")

# pylint: disable=wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils import atls  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (  # noqa: E402
    Measurements, extend_digest)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (  # noqa: E402
    AK_ALGS, VTPMIssuer, VTPMValidator)
from lab.swtpm import SwTPM, free_port  # noqa: E402
from tests.support.loopback import LoopbackServer  # noqa: E402

IMAGE_DIGEST = bytes.fromhex("5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d")


class PingServer(LoopbackServer):
    """Serial accept loop: handshake, answer b"ping" with b"pong", close."""

    def __init__(self, wrap):
        self._wrap = wrap
        super().__init__()

    def serve(self, sock):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = self._wrap(sock)
            if tls.recv(4) == b"ping":
                tls.sendall(b"pong")
            tls.close()
        except (OSError, atls.AttestationError):
            sock.close()


def percentile(samples, pct):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(pct / 100.0 * (len(ordered) - 1))))]


def measure(count, one):
    one()  # warm-up
    samples = []
    for _attempt in range(count):
        start = time.perf_counter()
        one()
        samples.append((time.perf_counter() - start) * 1000.0)
    return samples


def plain_server():
    key = atls.new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = atls.build_certificate(key.priv_key, [], now - atls.CERT_VALIDITY, now + atls.CERT_VALIDITY)
    server_ctx = atls.server_context()
    atls._load_certificate(server_ctx, key, cert)  # pylint: disable=protected-access
    server = PingServer(lambda sock: server_ctx.wrap_socket(sock, server_side=True))
    client_ctx = atls.client_context()
    sni = atls.encode_nonce(os.urandom(32))  # same SNI size as aTLS

    def one():
        raw = socket.create_connection(server.address, timeout=5)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with client_ctx.wrap_socket(raw, server_hostname=sni) as tls:
            tls.sendall(b"ping")
            assert tls.recv(4) == b"pong"
    return server, one


def attested_server(server_ctx, validator):
    server = PingServer(server_ctx.accept_handshake)

    def one():
        raw = socket.create_connection(server.address, timeout=5)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = atls.client_handshake(raw, [validator])
        with conn.sock as tls:
            tls.sendall(b"ping")
            assert tls.recv(4) == b"pong"
    return server, one


def interleaved(count, plain_one, atls_one, plain_per_atls=2):
    """Alternates plain and aTLS connections, so that load from other processes on this shared
    machine weighs on both series alike."""
    plain_one()
    atls_one()
    plain, attested = [], []
    for _attempt in range(count):
        for _plain in range(plain_per_atls):
            start = time.perf_counter()
            plain_one()
            plain.append((time.perf_counter() - start) * 1000.0)
        start = time.perf_counter()
        atls_one()
        attested.append((time.perf_counter() - start) * 1000.0)
    return plain, attested


def validations_per_second(issuer, validator, seconds=2.0, limit=20000):
    key = atls.new_key()
    nonce = os.urandom(32)
    document = issuer.issue(key.spki_hash, nonce)
    validator.validate(document, nonce)
    done = 0
    start = time.perf_counter()
    while done < limit and time.perf_counter() - start < seconds:
        validator.validate(document, nonce)
        done += 1
    return done / (time.perf_counter() - start), len(document)


def breakdown(issuer, validator, count=30):
    """Server-side steps of one aTLS handshake, each alone (ms, p50)."""
    key = atls.new_key()
    nonce = os.urandom(32)
    now = datetime.datetime.now(datetime.timezone.utc)
    document = issuer.issue(key.spki_hash, nonce)
    cert = atls.build_certificate(key.priv_key, [(issuer.oid, document)], now, now + atls.CERT_VALIDITY)
    der = cert.public_bytes(Encoding.DER)
    steps = {
        "quote (issuer.issue)": lambda: issuer.issue(key.spki_hash, nonce),
        "ECDSA key + context (pooled)": atls.new_key,
        "certificate build": lambda: atls.build_certificate(key.priv_key, [(issuer.oid, document)], now,
                                                            now + atls.CERT_VALIDITY),
        "load_cert_chain (memfd)": lambda: atls._load_certificate(  # pylint: disable=protected-access
            atls.server_context(), key, cert),
        "client: verify certificate": lambda: atls.verify_peer_certificate(der, [validator], nonce),
    }
    return {name: statistics.median(measure(count, step)) for name, step in steps.items()}


def run_alg(swtpm, validator, ak_alg, count):
    """Interleaved plain TLS and aTLS (one AK algorithm), validator rate and the server's steps."""
    # The lab's TPMs (swtpm_setup --pcr-banks sha256) have one bank; libtpms' unconfigured
    # default has four, and go-tpm-tools quotes every allocated bank.
    with VTPMIssuer(swtpm.tcti, event_log_path=None, banks=["sha256"], ak_alg=ak_alg) as issuer, \
            atls.AttestedServerContext(issuer) as server_ctx:
        plain_srv, plain_one = plain_server()
        atls_srv, atls_one = attested_server(server_ctx, validator)
        try:
            plain, attested = interleaved(count, plain_one, atls_one)
        finally:
            plain_srv.close()
            atls_srv.close()
        rate, doc_size = validations_per_second(issuer, validator)
        steps = breakdown(issuer, validator)
    with VTPMIssuer(swtpm.tcti, event_log_path=None, ak_alg=ak_alg) as all_banks, \
            atls.AttestedServerContext(all_banks) as server_ctx:
        atls_srv, atls_one = attested_server(server_ctx, validator)
        try:
            attested_all = measure(max(count // 5, 10), atls_one)
        finally:
            atls_srv.close()
    return {"plain": plain, "attested": attested, "attested_all": attested_all, "rate": rate, "doc_size": doc_size,
            "steps": steps}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atls", type=int, default=150,
                        help="aTLS handshakes per AK algorithm (default 150); twice as many plain ones, interleaved")
    args = parser.parse_args()
    load = os.getloadavg()

    state = tempfile.mkdtemp(prefix="atls-bench-")
    swtpm = SwTPM(state, free_port()).start()
    runs = {}
    try:
        tpm.extend_pcr(swtpm.tcti, 4, IMAGE_DIGEST)  # a measured boot, so the policy is not all zeros
        policy = Measurements.from_dict({
            "4": extend_digest(bytes(32), IMAGE_DIGEST).hex(), "8": "00" * 32, "9": "00" * 32,
            "11": "00" * 32, "12": "00" * 32, "13": "00" * 32, "15": "00" * 32})
        validator = VTPMValidator(policy)
        for ak_alg in AK_ALGS:
            runs[ak_alg] = run_alg(swtpm, validator, ak_alg, args.atls)
    finally:
        swtpm.stop()
        for name in os.listdir(state):
            os.unlink(os.path.join(state, name))
        os.rmdir(state)

    # The baseline: every plain TLS handshake of the run (both series), interleaved with the aTLS ones.
    plain = runs["rsa"]["plain"] + runs["ecc"]["plain"]
    plain_p50 = statistics.median(plain)
    print("load average: %.2f %.2f %.2f (2 cores)" % load)
    print("%-46s %9s %9s %7s" % ("loopback, handshake + 1 round trip", "p50 ms", "p99 ms", "/plain"))
    print("%-46s %9.2f %9.2f %7.2f" % ("plain TLS 1.3 (baseline, %d)" % len(plain), plain_p50, percentile(plain, 99), 1.0))
    result = {"plain_tls_p50_ms": round(plain_p50, 3), "plain_tls_p99_ms": round(percentile(plain, 99), 3),
              "load_avg_1m": round(load[0], 2)}
    for ak_alg, run in runs.items():
        p50 = statistics.median(run["attested"])
        all_p50 = statistics.median(run["attested_all"])
        label = ak_alg.upper() + (" P-256" if ak_alg == "ecc" else "-2048")
        print("%-46s %9.2f %9.2f %7.2f" % ("aTLS, %s AK, sha256 bank (%d)" % (label, len(run["attested"])), p50,
                                           percentile(run["attested"], 99), p50 / plain_p50))
        print("%-46s %9.2f %9.2f %7.2f" % ("aTLS, %s AK, all 4 banks (%d)" % (label, len(run["attested_all"])),
                                           all_p50, percentile(run["attested_all"], 99), all_p50 / plain_p50))
        suffix = "" if ak_alg == "rsa" else "_" + ak_alg
        quote_p50 = run["steps"]["quote (issuer.issue)"]
        result.update({
            "atls%s_p50_ms" % suffix: round(p50, 3),
            "atls%s_p99_ms" % suffix: round(percentile(run["attested"], 99), 3),
            "atls%s_all_banks_p50_ms" % suffix: round(all_p50, 3),
            "ratio%s" % suffix: round(p50 / plain_p50, 2),
            "atls%s_minus_plain_minus_quote_ms" % suffix: round(p50 - plain_p50 - quote_p50, 3),
            "validations%s_per_s" % suffix: round(run["rate"], 1),
            "steps%s_p50_ms" % suffix: {k: round(v, 3) for k, v in run["steps"].items()},
        })
    for ak_alg, run in runs.items():
        print("%s AK: validator alone %.0f validations/s (document %d bytes); server steps alone (p50 ms):"
              % (ak_alg.upper(), run["rate"], run["doc_size"]))
        for name, value in run["steps"].items():
            print("  %-44s %7.3f" % (name, value))
    print("ratio aTLS / plain (p50): RSA %.2f, ECC %.2f" % (result["ratio"], result["ratio_ecc"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
