# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""aTLS handshake cost against plain TLS, measured in the same run on loopback.

Prints: plain TLS 1.3 handshake + 1 round trip (p50/p99); the same with aTLS against a real
swtpm (qemu-vtpm issuer, full client validation), once with the RSA-2048 AK (the default,
``ratio``/``atls_p50_ms``) and once with the ECC P-256 AK (``ak_alg: ecc``, ``ratio_ecc``/
``atls_ecc_p50_ms``), each interleaved with plain handshakes; where pyOpenSSL is installed, the
same on the pyOpenSSL candidate (below; ``ratio_pyopenssl``/``ratio_ecc_pyopenssl``, against the
same stdlib plain baseline) and a plain pyOpenSSL handshake, all in turns with the stdlib ones;
validations per second of the validator alone on a pre-made document; and where the server's time
goes. Then the SEV-SNP variant ``sev-snp`` (the lab's platform on a unix socket standing for the CPU's secure
processor, the lab's AMD chain in AMD's profile: RSA-4096 PSS ARK and ASK, ECDSA P-384 VCEK), interleaved with
plain handshakes in the same way, and what one report validation costs with the signer's chain verified
(cold: ``sev_snp.verify_report`` without a cache) and with the chain cached (the validator's ``ChainCache``:
a signer's chain is verified once per process). The last line is one JSON object. Bounded loops, loopback only,
about a minute.

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
import shutil
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

try:
    from OpenSSL import SSL, crypto
    from OpenSSL.version import __version__ as PYOPENSSL_VERSION
except ImportError:  # the candidate is measured only where pyOpenSSL is installed
    SSL = crypto = PYOPENSSL_VERSION = None

sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "collections"),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
os.environ.setdefault("TSS2_LOG", "all+none")

# pylint: disable=wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils import atls  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (  # noqa: E402
    Measurements, extend_digest)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import (  # noqa: E402
    choose, sev_snp, snp_inspect)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (  # noqa: E402
    AK_ALGS, VTPMIssuer, VTPMValidator)
from lab.swtpm import SwTPM, free_port  # noqa: E402
from lab import snp_platform  # noqa: E402
from lab.amd import lab_chain  # noqa: E402
from lab.azure_hcl import provision  # noqa: E402
from lab.snp import lab_snp_policy  # noqa: E402
from tests.support.loopback import LoopbackServer  # noqa: E402

IMAGE_DIGEST = bytes.fromhex("5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d")


# ---------------------------------------------------------------------------------------------
# The pyOpenSSL candidate (docs/atls.md, "pyOpenSSL: measured, not adopted"). The server and the
# client do what module_utils/atls.py does with the same pieces (nonce decoding, key pool, issuer
# under its deadline, certificate builder, verify_peer_certificate before the first byte), so the
# two differ only in the TLS library: the server hands each connection its certificate and key in
# memory (Connection.use_certificate / use_privatekey in the servername callback: no per-connection
# context, no PEM, no file). Blocking sockets without timeouts: a benchmark, not the product.

_ALPN = [p.encode("ascii") for p in atls.ALPN_PROTOCOLS]


def _native_objects() -> bool:
    """pyOpenSSL >= 24.3 takes cryptography's objects; older releases (Debian 12: 23.0.0) want
    X509/PKey (``X509.from_cryptography`` since 17.1, ``PKey.from_cryptography_key`` since 16.1)."""
    return "as_cryptography" in SSL.Connection.get_peer_certificate.__code__.co_varnames


NATIVE = SSL is not None and _native_objects()


def _use(target, priv_key, cert) -> None:
    if NATIVE:
        target.use_certificate(cert)
        target.use_privatekey(priv_key)
    else:
        target.use_certificate(crypto.X509.from_cryptography(cert))
        target.use_privatekey(crypto.PKey.from_cryptography_key(priv_key))


def peer_der(conn: SSL.Connection) -> bytes:
    if NATIVE:
        cert = conn.get_peer_certificate(as_cryptography=True)
        return cert.public_bytes(Encoding.DER) if cert is not None else b""
    cert = conn.get_peer_certificate()
    return crypto.dump_certificate(crypto.FILETYPE_ASN1, cert) if cert is not None else b""


def _select_alpn(_conn, offered):
    for proto in _ALPN:  # server preference, as the stdlib server
        if proto in offered:
            return proto
    return SSL.NO_OVERLAPPING_PROTOCOLS


def ossl_server_context() -> SSL.Context:
    """aTLS's TLS parameters: TLS 1.2 or newer, no stateless tickets, no session cache, ALPN.
    TLS 1.3 still sends two (stateful) tickets after the handshake: pyOpenSSL does not bind
    SSL_CTX_set_num_tickets, and with the cache off they cannot resume (openssl/openssl#8077)."""
    ctx = _ossl_context(SSL.TLS_SERVER_METHOD)
    ctx.set_alpn_select_callback(_select_alpn)
    return ctx


def ossl_client_context() -> SSL.Context:
    ctx = _ossl_context(SSL.TLS_CLIENT_METHOD)
    ctx.set_alpn_protos(_ALPN)
    return ctx


def _ossl_context(method) -> SSL.Context:
    """Either side's part of aTLS's TLS parameters (ossl_server_context)."""
    ctx = SSL.Context(method)
    ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
    ctx.set_options(SSL.OP_NO_TICKET)
    ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
    return ctx


def ossl_plain_context(priv_key, cert) -> SSL.Context:
    ctx = ossl_server_context()
    _use(ctx, priv_key, cert)
    return ctx


def _light_key() -> atls.PooledKey:
    """A pooled key without the SSLContext the stdlib server needs per connection."""
    priv_key = ec.generate_private_key(ec.SECP256R1())
    return atls.PooledKey(priv_key, b"", atls.spki_hash(priv_key.public_key()), None)


class OsslAttestedServer(atls.AttestedServerContext):
    """The server half (issuer, deadline and certificate_for as the stdlib server; a pool of keys
    only); ``accept(sock)`` runs the handshake and returns the SSL.Connection."""

    def __init__(self, issuer):
        super().__init__(issuer, key_pool_size=0)
        self._pool = atls._KeyPool(atls.KEY_POOL_SIZE, _light_key)  # pylint: disable=protected-access
        self.attested = self
        self.context = ossl_server_context()
        self.context.set_tlsext_servername_callback(self._on_client_hello)

    def _on_client_hello(self, conn: SSL.Connection) -> None:
        name = conn.get_servername()
        nonce = atls.decode_nonce(name.decode("latin-1") if name else None)
        key, cert = self.attested.certificate_for(nonce)
        _use(conn, key.priv_key, cert)

    def accept(self, sock: socket.socket) -> SSL.Connection:
        conn = SSL.Connection(self.context, sock)
        conn.set_accept_state()
        conn.do_handshake()
        return conn


_CLIENT = None


def ossl_client_handshake(raw_sock: socket.socket, validators) -> SSL.Connection:
    """The client half: a fresh nonce as SNI, the handshake, then verify_peer_certificate before the
    caller may send a byte (docs/atls.md, "Client: verify before the first byte")."""
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = ossl_client_context()
    nonce = os.urandom(atls.NONCE_SIZE)
    conn = SSL.Connection(_CLIENT, raw_sock)
    conn.set_connect_state()
    conn.set_tlsext_host_name(atls.encode_nonce(nonce).encode("ascii"))
    try:
        conn.do_handshake()
        atls.verify_peer_certificate(peer_der(conn), validators, nonce)
    except BaseException:
        raw_sock.close()
        raise
    return conn


def ossl_load_step(priv_key, cert):
    """What replaces ``_load_certificate`` (memfd + load_cert_chain): one call per object."""
    conn = SSL.Connection(ossl_server_context(), None)
    return lambda: _use(conn, priv_key, cert)


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
        except (OSError, atls.AttestationError) + ((SSL.Error,) if SSL is not None else ()):
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


def _plain_certificate():
    key = atls.new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    return key, atls.build_certificate(key.priv_key, [], now - atls.CERT_VALIDITY, now + atls.CERT_VALIDITY)


def _connect(server, blocking=False):
    raw = socket.create_connection(server.address, timeout=5)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if blocking:  # pyOpenSSL on a socket with a timeout would raise WantReadError instead of waiting
        raw.settimeout(None)
    return raw


def plain_server():
    key, cert = _plain_certificate()
    server_ctx = atls.server_context()
    atls._load_certificate(server_ctx, key, cert)  # pylint: disable=protected-access
    server = PingServer(lambda sock: server_ctx.wrap_socket(sock, server_side=True))
    client_ctx = atls.client_context()
    sni = atls.encode_nonce(os.urandom(32))  # same SNI size as aTLS

    def one():
        with client_ctx.wrap_socket(_connect(server), server_hostname=sni) as tls:
            tls.sendall(b"ping")
            assert tls.recv(4) == b"pong"
    return server, one


def attested_server(server_ctx, validator):
    server = PingServer(server_ctx.accept_handshake)

    def one():
        conn = atls.client_handshake(_connect(server), [validator])
        with conn.sock as tls:
            tls.sendall(b"ping")
            assert tls.recv(4) == b"pong"
    return server, one


def plain_server_pyopenssl():
    key, cert = _plain_certificate()
    server_ctx = ossl_plain_context(key.priv_key, cert)

    def accept(sock):
        conn = SSL.Connection(server_ctx, sock)
        conn.set_accept_state()
        conn.do_handshake()
        return conn
    server = PingServer(accept)
    client_ctx = ossl_client_context()
    sni = atls.encode_nonce(os.urandom(32)).encode("ascii")

    def one():
        raw = _connect(server, blocking=True)
        conn = SSL.Connection(client_ctx, raw)
        conn.set_connect_state()
        conn.set_tlsext_host_name(sni)
        conn.do_handshake()
        conn.sendall(b"ping")
        assert conn.recv(4) == b"pong"
        raw.close()
    return server, one


def attested_server_pyopenssl(ossl_server, validator):
    server = PingServer(ossl_server.accept)

    def one():
        raw = _connect(server, blocking=True)
        conn = ossl_client_handshake(raw, [validator])
        conn.sendall(b"ping")
        assert conn.recv(4) == b"pong"
        raw.close()
    return server, one


def interleaved(count, series, rounds):
    """Runs the series in turns (``rounds``: the names of one turn, a name may repeat), so that load
    from other processes on this shared machine weighs on all alike. Returns {name: [ms]}."""
    for one in series.values():
        one()  # warm-up
    samples = {name: [] for name in series}
    for _attempt in range(count):
        for name in rounds:
            start = time.perf_counter()
            series[name]()
            samples[name].append((time.perf_counter() - start) * 1000.0)
    return samples


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
    if SSL is not None:
        steps["pyOpenSSL: ECDSA key (pooled)"] = _light_key
        steps["pyOpenSSL: use_certificate + use_privatekey"] = ossl_load_step(key.priv_key, cert)
    return {name: statistics.median(measure(count, step)) for name, step in steps.items()}


def run_alg(swtpm, validator, ak_alg, count):
    """Interleaved plain TLS and aTLS (one AK algorithm; the stdlib and, where installed, the
    pyOpenSSL candidate), validator rate and the server's steps."""
    # The lab's TPMs (swtpm_setup --pcr-banks sha256) have one bank; libtpms' unconfigured
    # default has four, and go-tpm-tools quotes every allocated bank.
    with VTPMIssuer(swtpm.tcti, event_log_path=None, banks=["sha256"], ak_alg=ak_alg) as issuer, \
            atls.AttestedServerContext(issuer) as server_ctx:
        servers, series = [], {}
        rounds = ["plain", "attested", "plain"]  # two plain handshakes per aTLS one, as before
        try:
            for name, (server, one) in [("plain", plain_server()), ("attested", attested_server(server_ctx, validator))]:
                servers.append(server)
                series[name] = one
            if SSL is not None:
                ossl_server = OsslAttestedServer(issuer)
                servers.append(ossl_server)
                for name, (server, one) in [("plain_pyopenssl", plain_server_pyopenssl()),
                                            ("attested_pyopenssl", attested_server_pyopenssl(ossl_server, validator))]:
                    servers.append(server)
                    series[name] = one
                rounds = ["plain", "attested", "plain_pyopenssl", "attested_pyopenssl", "plain"]
            samples = interleaved(count, series, rounds)
        finally:
            for server in servers:
                server.close()
        rate, doc_size = validations_per_second(issuer, validator)
        steps = breakdown(issuer, validator)
    with VTPMIssuer(swtpm.tcti, event_log_path=None, ak_alg=ak_alg) as all_banks, \
            atls.AttestedServerContext(all_banks) as server_ctx:
        atls_srv, atls_one = attested_server(server_ctx, validator)
        try:
            attested_all = measure(max(count // 5, 10), atls_one)
        finally:
            atls_srv.close()
    return dict(samples, attested_all=attested_all, rate=rate, doc_size=doc_size, steps=steps)


def snp_instance_info(document: bytes):
    """(report, signer, chain) of an SEV-SNP document, as its validator reads them."""
    raw, signer, chain = snp_inspect.instance_info(document)
    return sev_snp.parse_report(raw), signer, chain


def chain_costs(issuer, roots, count):
    """One report's verification (signature, VCEK extensions, chain) p50 ms: cold (every certificate of the
    chain verified: no cache) and cached (the signer's chain verified once, then looked up)."""
    report, signer, chain = snp_instance_info(issuer.issue(b"bench", os.urandom(32)))
    cache = sev_snp.ChainCache()
    sev_snp.verify_report(report, signer, chain, roots=roots, cache=cache)
    cold = measure(count, lambda: sev_snp.verify_report(report, signer, chain, roots=roots, cache=None))
    cached = measure(count * 5, lambda: sev_snp.verify_report(report, signer, chain, roots=roots, cache=cache))
    return statistics.median(cold), statistics.median(cached)


# The variants that verify AMD SEV-SNP reports, in the chooser's order.
SNP_VARIANTS = tuple(name for name in choose.VARIANT_NAMES if choose.spec(name).needs_amd_roots)


def _snp_sides(variant, lab_state, swtpm, folder):
    """(issuer, policy, stop) of one SEV-SNP variant on the lab's platform: ``sev-snp`` and ``aws-sev-snp`` get their
    report over the platform's socket (aws: a VLEK, report_data binding the swtpm's AK), ``azure-sev-snp`` from the
    HCL report the lab writes into a swtpm of its own with an EK certificate (Azure's paravisor's part)."""
    folder.mkdir()
    platform = snp_platform.SNPPlatform(folder, lab_state)
    platform.state(signing_key="vlek" if variant == "aws-sev-snp" else "vcek")
    snp = lab_snp_policy()
    if variant == "azure-sev-snp":
        own = SwTPM(str(folder / "tpm"), free_port(), ek_cert=True, ca_dir=str(folder)).start()
        provision(own.tcti, platform, folder / "certs")
        issuer = choose.issuer(variant, own.tcti, event_log_path=None, amd_cert_cache=str(folder / "certs"))
        pcrs = tpm.read_pcrs(own.tcti, "sha256")
        return issuer, Measurements.from_dict({"4": pcrs[4].hex(), "snp": snp}), lambda: (issuer.close(), own.stop())
    service = snp_platform.serve(folder / "platform.sock", platform)
    source = "unix:%s" % (folder / "platform.sock")

    def stop():
        close = getattr(issuer, "close", None)
        if close is not None:
            close()
        service.shutdown()
        service.server_close()
    if variant == "sev-snp":
        issuer = choose.issuer(variant, None, snp_report_source=source)
        return issuer, Measurements.from_dict({"snp": snp}), stop
    issuer = choose.issuer(variant, swtpm.tcti, event_log_path=None, banks=["sha256"], snp_report_source=source)
    pcrs = tpm.read_pcrs(swtpm.tcti, "sha256")
    return issuer, Measurements.from_dict({"4": pcrs[4].hex(), "snp": snp}), stop


def run_snp(count, swtpm):
    """The SEV-SNP variants against the lab's platform: aTLS interleaved with plain TLS, each validator's rate
    (chain cached), the issuer's time, and one report's verification cold and cached."""
    state = Path(tempfile.mkdtemp(prefix="atls-bench-snp-"))
    stops, servers, results = [], [], {}
    try:
        roots = sev_snp.load_roots(str(lab_chain(state / "lab").ensure().roots_path))
        series = {}
        sides = {}
        for variant in SNP_VARIANTS:
            issuer, policy, stop = _snp_sides(variant, state / "lab", swtpm, state / variant)
            stops.append(stop)
            trust = choose.Trust(amd_roots=roots, snp_cache=sev_snp.ChainCache())
            validator = choose.validator(variant, policy, trust)
            context = atls.AttestedServerContext(issuer)
            stops.append(context.close)
            server, one = attested_server(context, validator)
            servers.append(server)
            series[variant] = one
            sides[variant] = (issuer, validator)
        server, series["plain"] = plain_server()
        servers.append(server)
        samples = interleaved(count, series, ["plain"] + list(SNP_VARIANTS) + ["plain"])
        for server in servers:
            server.close()
        servers = []
        for variant, (issuer, validator) in sides.items():
            rate, doc_size = validations_per_second(issuer, validator)
            issue = statistics.median(measure(30, lambda i=issuer: i.issue(b"b", os.urandom(32))))
            results[variant] = dict(attested=samples[variant], rate=rate, doc_size=doc_size, issue=issue)
        cold, cached = chain_costs(sides["sev-snp"][0], roots, 30)
    finally:
        for server in servers:
            server.close()
        for stop in reversed(stops):
            stop()
        shutil.rmtree(str(state), ignore_errors=True)
    return dict(plain=samples["plain"], variants=results, verify_cold=cold, verify_cached=cached)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atls", type=int, default=150,
                        help="aTLS handshakes per AK algorithm and library (default 150); twice as many plain "
                             "stdlib ones and as many plain pyOpenSSL ones, interleaved")
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
        snp = run_snp(args.atls, swtpm)
    finally:
        swtpm.stop()
        for name in os.listdir(state):
            os.unlink(os.path.join(state, name))
        os.rmdir(state)
    load_after = os.getloadavg()

    # The baseline: every plain stdlib TLS handshake of the run (all series), interleaved with the aTLS ones.
    plain = runs["rsa"]["plain"] + runs["ecc"]["plain"] + snp["plain"]
    plain_p50 = statistics.median(plain)
    print("load average: %.2f %.2f %.2f before, %.2f %.2f %.2f after (2 cores)" % (load + load_after))
    print("%-52s %9s %9s %7s" % ("loopback, handshake + 1 round trip", "p50 ms", "p99 ms", "/plain"))
    print("%-52s %9.2f %9.2f %7.2f" % ("plain TLS 1.3, stdlib (baseline, %d)" % len(plain), plain_p50,
                                       percentile(plain, 99), 1.0))
    result = {"plain_tls_p50_ms": round(plain_p50, 3), "plain_tls_p99_ms": round(percentile(plain, 99), 3),
              "load_avg_1m": round(load[0], 2), "load_avg_1m_after": round(load_after[0], 2),
              "pyopenssl": PYOPENSSL_VERSION}
    if SSL is not None:
        plain_ossl = runs["rsa"]["plain_pyopenssl"] + runs["ecc"]["plain_pyopenssl"]
        plain_ossl_p50 = statistics.median(plain_ossl)
        print("%-52s %9.2f %9.2f %7.2f" % ("plain TLS 1.3, pyOpenSSL %s (%d)" % (PYOPENSSL_VERSION, len(plain_ossl)),
                                           plain_ossl_p50, percentile(plain_ossl, 99), plain_ossl_p50 / plain_p50))
        result.update({"plain_tls_pyopenssl_p50_ms": round(plain_ossl_p50, 3),
                       "plain_tls_pyopenssl_p99_ms": round(percentile(plain_ossl, 99), 3)})
    for ak_alg, run in runs.items():
        p50 = statistics.median(run["attested"])
        all_p50 = statistics.median(run["attested_all"])
        label = ak_alg.upper() + (" P-256" if ak_alg == "ecc" else "-2048")
        print("%-52s %9.2f %9.2f %7.2f" % ("aTLS, %s AK, sha256 bank (%d)" % (label, len(run["attested"])), p50,
                                           percentile(run["attested"], 99), p50 / plain_p50))
        if SSL is not None:
            ossl_p50 = statistics.median(run["attested_pyopenssl"])
            print("%-52s %9.2f %9.2f %7.2f" % ("aTLS, %s AK, sha256 bank, pyOpenSSL (%d)"
                                               % (label, len(run["attested_pyopenssl"])), ossl_p50,
                                               percentile(run["attested_pyopenssl"], 99), ossl_p50 / plain_p50))
        print("%-52s %9.2f %9.2f %7.2f" % ("aTLS, %s AK, all 4 banks (%d)" % (label, len(run["attested_all"])),
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
        if SSL is not None:
            result.update({
                "atls%s_pyopenssl_p50_ms" % suffix: round(ossl_p50, 3),
                "atls%s_pyopenssl_p99_ms" % suffix: round(percentile(run["attested_pyopenssl"], 99), 3),
                "ratio%s_pyopenssl" % suffix: round(ossl_p50 / plain_p50, 2),
                "ratio%s_pyopenssl_vs_plain_pyopenssl" % suffix: round(ossl_p50 / plain_ossl_p50, 2),
            })
    for variant, run in snp["variants"].items():
        p50 = statistics.median(run["attested"])
        print("%-52s %9.2f %9.2f %7.2f" % ("aTLS, %s, lab platform (%d)" % (variant, len(run["attested"])), p50,
                                           percentile(run["attested"], 99), p50 / plain_p50))
        key = variant.replace("-", "_")
        result.update({"atls_%s_p50_ms" % key: round(p50, 3),
                       "atls_%s_p99_ms" % key: round(percentile(run["attested"], 99), 3),
                       "ratio_%s" % key: round(p50 / plain_p50, 2),
                       "validations_%s_per_s" % key: round(run["rate"], 1),
                       "issue_%s_ms" % key: round(run["issue"], 3)})
    result.update({"sev_snp_verify_cold_ms": round(snp["verify_cold"], 3),
                   "sev_snp_verify_cached_ms": round(snp["verify_cached"], 3)})
    for ak_alg, run in runs.items():
        print("%s AK: validator alone %.0f validations/s (document %d bytes); server steps alone (p50 ms):"
              % (ak_alg.upper(), run["rate"], run["doc_size"]))
        for name, value in run["steps"].items():
            print("  %-44s %7.3f" % (name, value))
    for variant, run in snp["variants"].items():
        print("%s: validator alone %.0f validations/s (document %d bytes, chain cached); issuer %.3f ms"
              % (variant, run["rate"], run["doc_size"], run["issue"]))
    print("one SEV-SNP report verified (signature, VCEK extensions, chain to the ARK): %.3f ms cold, %.3f ms with "
          "the signer's chain cached" % (snp["verify_cold"], snp["verify_cached"]))
    print("ratio aTLS / plain (p50): RSA %.2f, ECC %.2f, %s" % (
        result["ratio"], result["ratio_ecc"],
        ", ".join("%s %.2f" % (v, result["ratio_" + v.replace("-", "_")]) for v in SNP_VARIANTS)))
    if SSL is not None:
        print("ratio aTLS on pyOpenSSL / plain stdlib (p50): RSA %.2f, ECC %.2f"
              % (result["ratio_pyopenssl"], result["ratio_ecc_pyopenssl"]))
    else:
        print("pyOpenSSL is not installed: its candidate was not measured")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
