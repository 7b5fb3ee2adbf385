# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fuzz targets: every parser of untrusted data, its seed corpus and its mutator.

Shared by the property-based tests of tests/unit/fuzz (a few seconds each in ``make test``) and
by scripts/fuzz.py (``make fuzz``: at least 100,000 inputs per parser), imported by the collection
path so that pytest, ansible-test units and the script all find it.

The contract each target checks: a parser returns a valid object or raises one
of the project's documented errors (``errors.ConstellationError`` and its subclasses: InputError,
AttestationError, ProtocolError, ...), never anything else; and no error message holds secret
material (``Target.secrets``: the KMS key and salt of the seeds, in every spelling they have there).

Seeds come from real documents: the attestation document is issued by a swtpm (``build_corpus``),
the others are what our own encoders write. Mutations work on the JSON structure (a value replaced
by another JSON type, by deep nesting, a huge number, odd unicode or PCR-like keys; subtrees
swapped, dropped, duplicated) and on the bytes (flips, inserts, cuts, splices).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import eventlog, sev_snp, tpm_wire
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurement, Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import load_policy_file
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import JoinTicket
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_json
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import check_kubelet_csr
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import framing, schema

# Known secrets of the seeds: they must never show up in an error message.
KMS_KEY = bytes(range(1, 33))
KMS_SALT = bytes(range(101, 133))
NONCE = bytes(range(32))

# Values a mutation puts in place of another. Sentinels become raw JSON text after dumping
# (json.dumps cannot write them: 5,000-digit integers, NaN, 10,000 levels of nesting).
_RAW = {
    "\x00DEEP\x00": "[" * 10000 + "]" * 10000,
    "\x00DEEPOBJ\x00": '{"a":' * 3000 + "1" + "}" * 3000,
    "\x00BIGINT\x00": "9" * 5000,
    "\x00NAN\x00": "NaN",
    "\x00INF\x00": "-Infinity",
    "\x00BIGFLOAT\x00": "1e999",
}
ODD_KEYS = ("²", "٣", "04", "-1", " 4", "4 ", "24", "1" * 5000, "", "\ud800", "é", "\u0000", "true", "4.0",
            "key", "salt", "UserData", "hash", "pcrs", "method", "params", "expected", "warnOnly", "state_dir")
ODD_VALUES: Tuple[Any, ...] = (
    None, True, False, 0, -1, 11, 2 ** 64, -2 ** 63, 1.5, 1e308, "", "²", "x" * 70000, "\ud800", "\u202e",
    [], {}, [[[]]], {"": {}}, "AAAA", "=", "%ZZ", "kms://", "0" * 64, list(range(30)),
) + tuple(_RAW)


def dumps(obj: Any) -> str:
    """JSON text of a (mutated) tree, sentinels written raw."""
    text = json.dumps(obj, separators=(",", ":"))
    for sentinel, raw in _RAW.items():
        quoted = json.dumps(sentinel)
        if quoted in text:
            text = text.replace(quoted, raw)
    return text


def _paths(obj: Any, path: Tuple = (), out: Optional[List[Tuple]] = None, limit: int = 400) -> List[Tuple]:
    out = [] if out is None else out
    out.append(path)
    if len(out) >= limit:
        return out
    if isinstance(obj, dict):
        for key in list(obj):
            _paths(obj[key], path + (key,), out, limit)
    elif isinstance(obj, list):
        for index, item in enumerate(obj):
            _paths(item, path + (index,), out, limit)
    return out


def _get(obj: Any, path: Tuple) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def _odd(rng: random.Random) -> Any:
    return copy.deepcopy(rng.choice(ODD_VALUES))  # never share (and so mutate) the table's own lists


def _random_value(rng: random.Random, tree: Any) -> Any:
    pick = rng.randrange(6)
    if pick == 0:
        return copy.deepcopy(_get(tree, rng.choice(_paths(tree))))  # another subtree of the same document
    if pick == 1:
        return [_odd(rng) for _unused in range(rng.randrange(4))]
    if pick == 2:
        return {rng.choice(ODD_KEYS): _odd(rng)}
    if pick == 3:
        return "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x80, 0x3000)))) for _unused in range(rng.randrange(12)))
    return _odd(rng)


def mutate_tree(tree: Any, rng: random.Random, rounds: int = 0) -> Any:
    """A copy of a JSON tree with 1-4 structural mutations."""
    tree = copy.deepcopy(tree)
    for _round in range(rounds or rng.randrange(1, 5)):
        path = rng.choice(_paths(tree))
        if not path:
            if rng.random() < 0.1:
                tree = _random_value(rng, tree)
            continue
        parent = _get(tree, path[:-1])
        last = path[-1]
        op = rng.randrange(6)
        if op <= 1:
            parent[last] = _random_value(rng, tree)
        elif op == 2:
            del parent[last]
        elif op == 3 and isinstance(parent, dict):
            parent[rng.choice(ODD_KEYS)] = parent.pop(last)  # rename a key (PCR "²", "04", "true"...)
        elif op == 3:
            parent.insert(last, copy.deepcopy(parent[last]))
        elif op == 4:
            parent[last] = [parent[last]] if rng.random() < 0.5 else {rng.choice(ODD_KEYS): parent[last]}
        else:
            value = parent[last]
            if isinstance(value, str) and value:
                cut = rng.randrange(len(value))
                parent[last] = value[:cut] + rng.choice(("", "=", "²", "%", "&", "\x00", "A" * 5)) + value[cut + 1:]
            elif isinstance(value, int) and not isinstance(value, bool):
                parent[last] = rng.choice((value + 1, -value, value * 2 ** 70, float(value)))
            else:
                parent[last] = _odd(rng)
    return tree


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """1-4 byte-level mutations: flips, inserts, cuts, duplicated or spliced ranges."""
    buf = bytearray(data)
    for _round in range(rng.randrange(1, 5)):
        if not buf:
            buf.extend(os.urandom(rng.randrange(1, 16)) if rng.random() < 0.5 else b"{")
            continue
        pos = rng.randrange(len(buf))
        op = rng.randrange(7)
        if op == 0:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos] = rng.choice(b"\x00\xff\x80\xc3{}[]\",:\\=&%?#0129")
        elif op == 2:
            buf[pos:pos] = bytes(rng.randrange(256) for _unused in range(rng.randrange(1, 9)))
        elif op == 3:
            del buf[pos:pos + rng.randrange(1, 64)]
        elif op == 4:
            end = min(len(buf), pos + rng.randrange(1, 256))
            buf[pos:pos] = buf[pos:end]
        elif op == 5:
            del buf[pos:]
        else:
            buf[pos:pos] = rng.choice((b"\xed\xa0\x80", b"\xff\xfe", b"[[[[[[[[", b"\\u00", b"\xe2\x80\xae"))
    return bytes(buf)


# ------------------------------------------------------------------------------ targets


@dataclass
class Target:
    """One parser: ``run(input)`` returns or raises; ``mutate(seed, rng)`` makes an input from a seed."""

    name: str
    run: Callable[[Any], Any]
    seeds: Sequence[Any]
    mutate: Callable[[Any, random.Random], Any]
    secrets: Tuple[str, ...] = ()
    cleanup: List[Callable[[], None]] = field(default_factory=list)

    def input_from(self, rng: random.Random) -> Any:
        return self.mutate(rng.choice(self.seeds), rng)


def check(target: Target, data: Any) -> Optional[BaseException]:
    """Runs one input. Returns None when the parser answered as it must (a value or a documented
    error without secrets); otherwise the foreign exception (or an AssertionError naming the leak)."""
    try:
        target.run(data)
    except ConstellationError as err:
        text = "%s %r" % (err, err.args)
        for secret in target.secrets:
            if secret in text:
                return AssertionError("%s: error text holds secret material: %s" % (target.name, text[:300]))
        return None
    except Exception as err:  # pylint: disable=broad-except
        return err
    return None


def _json_or_bytes(tree_mutation: float = 0.7) -> Callable[[Any, random.Random], bytes]:
    """Seeds are JSON trees: most inputs are structural mutations, the rest byte mutations of their text."""
    def mutate(seed: Any, rng: random.Random) -> bytes:
        if rng.random() < tree_mutation:
            return dumps(mutate_tree(seed, rng)).encode("utf-8", "surrogatepass")
        text = dumps(mutate_tree(seed, rng) if rng.random() < 0.3 else seed)
        return mutate_bytes(text.encode("utf-8", "surrogatepass"), rng)
    return mutate


def _yaml_or_json(seed: Any, rng: random.Random) -> bytes:
    """Seeds are JSON trees (dumped as JSON or YAML, then maybe byte-mutated) or raw YAML texts."""
    import yaml

    if isinstance(seed, bytes):
        return mutate_bytes(seed, rng) if rng.random() < 0.5 else seed
    pick = rng.random()
    if pick < 0.6:
        return _json_or_bytes(0.8)(seed, rng)
    tree = mutate_tree(seed, rng)
    try:
        text = yaml.safe_dump(tree, allow_unicode=rng.random() < 0.5, default_flow_style=rng.random() < 0.3)
    except (yaml.YAMLError, RecursionError, ValueError):
        text = dumps(tree)
    data = text.encode("utf-8", "surrogatepass")
    return mutate_bytes(data, rng) if pick < 0.75 else data


YAML_SPECIALS = (
    b"true: 1\n4: {expected: '00'}\n",
    b"? [a, b]\n: 1\n",
    b"a: &a [*a]\n",
    b"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    b"d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
    b"f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n",
    b"\xff\xfe4: x\n",
    b"[" * 5000,
    b"{4: " * 2000,
    b"4: !!binary AAAA\n",
    b"4: 2001-01-01\n1.5: x\n",
    b"!!python/object:os.system x\n",
    b"4: .nan\n5: 0x_\n6: 1_0\n7: 0o9\n",
)


def _file_runner(target_name: str, parse: Callable[[str], Any]) -> Tuple[Callable[[bytes], Any], Callable[[], None]]:
    """The parser reads a file (as the operator's policy or config): one scratch file, rewritten per input."""
    handle, path = tempfile.mkstemp(prefix="fuzz-%s-" % target_name)
    os.close(handle)

    def run(data: bytes) -> Any:
        with open(path, "wb") as out:
            out.write(data)
        return parse(path)

    def cleanup() -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
    return run, cleanup


# -------------------------------------------------------------------------------- corpus


@dataclass
class Corpus:
    """Real documents to mutate: an attestation document issued by swtpm and the validator that accepts it."""

    document: bytes
    validator: Any
    event_log: bytes
    policy: Measurements


def build_corpus(workdir: str) -> Corpus:
    """Starts a swtpm in ``workdir``, simulates a measured boot with an event log (PCRs 4 and 9),
    issues one qemu-vtpm document for NONCE and stops the swtpm again."""
    from lab.swtpm import SwTPM, free_port
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import extend_pcr, read_pcrs
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer, VTPMValidator

    os.environ.setdefault("TSS2_LOG", "all+none")
    events = [(4, eventlog.EV_EFI_BOOT_SERVICES_APPLICATION, b"fuzz-image shim", None),
              (4, eventlog.EV_EFI_BOOT_SERVICES_APPLICATION, b"fuzz-image kernel", None),
              (9, eventlog.EV_IPL, b"fuzz-image cmdline", None),
              (4, eventlog.EV_SEPARATOR, b"\x00" * 4, None)]
    log = eventlog.build(events)
    log_path = os.path.join(workdir, "event_log")
    with open(log_path, "wb") as out:
        out.write(log)
    last = None
    for _attempt in range(5):  # a free port may be taken between probing and binding
        tpm = SwTPM(os.path.join(workdir, "tpm%d" % _attempt), free_port())
        try:
            tpm.start()
            break
        except Exception as err:  # pylint: disable=broad-except
            last = err
    else:
        raise last
    try:
        _sizes, parsed = eventlog.parse(log)
        for event in parsed:
            extend_pcr(tpm.tcti, event.pcr, event.digests[0x000B])
        pcrs = read_pcrs(tpm.tcti)
        with VTPMIssuer(tpm.tcti, event_log_path=log_path) as issuer:
            document = issuer.issue(b"fuzz user data", NONCE)
    finally:
        tpm.stop()
    policy = Measurements({i: Measurement(pcrs[i], i == 9) for i in (0, 4, 9, 11, 15)})
    validator = VTPMValidator(policy)
    validator.validate(document, NONCE)  # the seed is sound: mutations start from an accepted document
    return Corpus(document, validator, log, policy)


def _admin_pub_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32))).public_key()
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _kms_secrets() -> Tuple[str, ...]:
    spellings = []
    for raw in (KMS_KEY, KMS_SALT):
        for enc in (base64.urlsafe_b64encode, base64.b64encode):
            text = enc(raw).decode("ascii")
            spellings.extend((text, text.rstrip("=")[:24]))  # the whole value, and any leading 24 characters
        spellings.append(raw.hex())
    return tuple(spellings)


def _ticket_seed() -> dict:
    peers = [{"vpn_ip": "10.118.0.%d" % i, "vpn_pub_key": _b64(bytes([i]) * 32), "public_ip": "192.0.2.%d" % i,
              "role": "coordinator" if i == 1 else "node"} for i in (1, 11, 12)]
    return {"cluster_id": _b64(bytes(32)), "measurement_salt": _b64(b"s" * 32), "measurement_secret": _b64(b"m" * 32),
            "state_disk_key": _b64(b"d" * 32), "node_vpn_ip": "10.118.0.12", "peers": peers,
            "coordinator_vpn_ip": "10.118.0.1", "admin_pub_key": _admin_pub_key(),
            "kubeadm": {"api_server_endpoint": "10.118.0.1:6443", "token": "abcdef.0123456789abcdef"}}


def _frame_seeds() -> List[List[Tuple[int, Any]]]:
    kms_uri = kms.MasterSecret(KMS_KEY, KMS_SALT).to_uri()
    ticket = _ticket_seed()
    requests = [
        ("GetState", {}),
        ("ActivateAsCoordinator", {"kms_uri": kms_uri, "measurement_salt": _b64(b"s" * 32), "admin_pub_key": _admin_pub_key(),
                                   "storage_uri": kms.NO_STORE_URI, "cluster_config": {"kubernetes": {"version": "1.29"}}}),
        ("ActivateAsNode", {k: ticket[k] for k in ("node_vpn_ip", "peers", "cluster_id", "measurement_salt",
                                                   "admin_pub_key", "coordinator_vpn_ip")}),
        ("ActivateAdditionalNodes", {"node_public_endpoints": ["192.0.2.11:9000", "[2001:db8::1]:9000"]}),
        ("IssueJoinTicket", {"disk_uuid": "0d3c9f3e-8c4a-4f4b-9a53-3a3f1d0b2c11", "node_vpn_pub_key": _b64(b"v" * 32),
                             "is_control_plane": False}),
        ("Recover", {"kms_uri": kms_uri}),
        ("Exec", {"argv": ["/bin/true"], "cwd": "/", "env": {"A": "b"}, "timeout": 5.5}),
        ("PutFile", {"path": "/tmp/x", "mode": 420}),
        ("GetUpdate", {"resource_version": 3}),
        ("GetDataKey", {"data_key_id": "disk-1", "length": 32}),
    ]
    seeds = [[(framing.KIND_MSG, {"method": name, "params": params})] for name, params in requests]
    seeds.append([(framing.KIND_MSG, {"method": "PutFile", "params": {"path": "/tmp/y"}}),
                  (framing.KIND_DATA, b"\x00hello"), (framing.KIND_EOF, b"\x00")])
    seeds.append([(framing.KIND_END, {"result": {"state": "AcceptingInit", "state_code": 1, "role": "none"}}),
                  (framing.KIND_END, {"error": {"kind": "InputError", "message": "x", "reason": "r"}}),
                  (framing.KIND_MSG, {"nonce": _b64(NONCE)}), (framing.KIND_MSG, {"ticket": ticket})])
    return seeds


def encode_frames(frames: Sequence[Tuple[int, Any]]) -> bytes:
    out = []
    for kind, body in frames:
        payload = body if isinstance(body, (bytes, bytearray)) else dumps(body).encode("utf-8", "surrogatepass")
        out.append(framing.HEADER.pack(framing.MAGIC, framing.VERSION, kind, len(payload)) + bytes(payload))
    return b"".join(out)


def _mutate_frames(seed: List[Tuple[int, Any]], rng: random.Random) -> bytes:
    frames = list(seed)
    index = rng.randrange(len(frames))
    kind, body = frames[index]
    if not isinstance(body, (bytes, bytearray)) and rng.random() < 0.75:
        frames[index] = (kind, mutate_tree(body, rng))
    elif rng.random() < 0.3:
        frames[index] = (rng.randrange(6), body)
    data = encode_frames(frames)
    return mutate_bytes(data, rng) if rng.random() < 0.35 else data


class _BufferSocket:
    """A socket that hands out a fixed byte string, then EOF."""

    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.pos = 0

    def recv(self, size: int) -> bytes:
        chunk = bytes(self.data[self.pos:self.pos + size])
        self.pos += len(chunk)
        return chunk

    def sendall(self, data: bytes) -> None:
        return None


def parse_frames(data: bytes) -> int:
    """The agent's and the client's reading of a byte stream: frames, requests, their records,
    END answers; a refused frame ends the stream as the server ends that connection."""
    stream = framing.FrameStream(_BufferSocket(data))
    count = 0
    while True:
        try:
            frame = stream.recv()
        except framing.ConnectionClosed:
            return count
        except framing.MalformedMessage:  # the server answers it and reads on
            continue
        count += 1
        if frame.kind == framing.KIND_END:
            try:
                framing.raise_for_end(frame.message)
            except framing.RemoteError:
                pass
        elif frame.kind == framing.KIND_MSG:
            if "method" not in frame.message:
                continue
            method, params = framing.request_of(frame.message)
            spec = schema.METHODS.get(method)
            if spec is not None:
                spec.request.decode(params)
                if method in ("ActivateAsNode",):
                    from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import NodeActivationRequest
                    NodeActivationRequest.from_dict(params)
                if method in ("ActivateAsCoordinator", "Recover"):
                    kms.open_kms(params.get("kms_uri"), "kms_uri")


_URI_PIECES = ("&", "=", "?", "#", "%", "%25", "%2", "+", "/", ":", "@", "://", ";", " ", "²", "\x00", "key=", "salt=", "&key=",
               "kms:", "\u202e", "%ff")


def _mutate_uri(seed: str, rng: random.Random) -> str:
    chars = list(seed)
    for _round in range(rng.randrange(1, 5)):
        pos = rng.randrange(len(chars) + 1)
        op = rng.randrange(6)
        if op == 0 and chars:
            del chars[min(pos, len(chars) - 1)]
        elif op == 1:
            chars[pos:pos] = list(rng.choice(_URI_PIECES))
        elif op == 2 and chars:
            start = rng.randrange(len(chars))
            chars[pos:pos] = chars[start:start + rng.randrange(1, 48)]  # splice a piece of the URI (key material) elsewhere
        elif op == 3:
            del chars[pos:pos + rng.randrange(1, 12)]
        elif op == 4 and chars:
            chars[min(pos, len(chars) - 1)] = chr(rng.choice((rng.randrange(33, 127), rng.randrange(0x80, 0x400))))
        else:
            chars = chars[:pos]
    return "".join(chars)


def _parse_any_uri(uri: str) -> Any:
    if uri.startswith("storage"):
        return kms.parse_storage_uri(uri)
    return kms.open_kms(uri, "kms_uri")


def _agent_config_seed() -> dict:
    return {"state_dir": "/var/lib/constellation", "public_endpoint": "192.0.2.10:9000", "tcti": "swtpm:host=127.0.0.1,port=2321",
            "variant": "qemu-vtpm", "measurements": "/etc/constellation/measurements.json",
            "store": {"type": "file", "path": "/var/lib/constellation/store.json"}, "vpn_interface": "wg0",
            "vpnapi_port": 9027, "update_interval": 10, "coordinator_public_endpoint": "192.0.2.1:9000",
            "coordinator_pub_key": "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=",
            "join_interval": 5.0, "vpn_cidr": "10.118.0.0/16", "vpn_listen_port": 51820, "log_level": "info"}


def _validate_document(corpus: Corpus) -> Callable[[bytes], Any]:
    return lambda data: corpus.validator.validate(data, NONCE)


def _quote_parts(tree: Any) -> List[bytes]:
    """The raw TPMS_ATTEST and TPMT_SIGNATURE bytes of every quote in an attestation document's tree."""
    if isinstance(tree, dict):
        found = [base64.b64decode(tree[key]) for key in ("quote", "raw_sig") if isinstance(tree.get(key), str)]
        return found + [part for value in tree.values() for part in _quote_parts(value)]
    if isinstance(tree, list):
        return [part for value in tree for part in _quote_parts(value)]
    return []


def _parse_tpm_structures(data: bytes) -> None:
    """attestation/tpm_wire.py's decoders on one input, as the validator calls them: their one error
    (Malformed) becomes the AttestationError the validator raises."""
    for parse in (tpm_wire.parse_attest_header, tpm_wire.parse_quote_attest, tpm_wire.parse_signature):
        try:
            parse(data)
        except tpm_wire.Malformed as err:
            raise AttestationError("fuzz: %s" % err) from err


CSR_NODE_VPN_IP = "10.118.0.5"


def _csr_seeds() -> List[bytes]:
    """A kubelet's CSR as the join client makes it (O system:nodes, CN system:node:<name>, SANs: the
    name and its VPN IP), in PEM and DER: what a Node sends the Coordinator in GetJoinArgs/IssueJoinTicket."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                    x509.NameAttribute(NameOID.COMMON_NAME, "system:node:fuzz-node")]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName("fuzz-node"),
                                                       x509.IPAddress(ipaddress.ip_address(CSR_NODE_VPN_IP))]), False)
           .sign(key, hashes.SHA256()))
    return [csr.public_bytes(serialization.Encoding.PEM), csr.public_bytes(serialization.Encoding.DER)]


def _snp_vectors():
    # imported here: the fuzz tests' other targets need none of it
    from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as snp_vectors
    return snp_vectors.vectors()


def _mutate_report(seed: bytes, rng: random.Random) -> bytes:
    """Half the inputs keep the report's size (flipped bits and bytes, reserved fields, a TCB), so the parser's and
    the verifier's later checks run; the other half are mutate_bytes'."""
    if rng.random() < 0.5:
        return mutate_bytes(seed, rng)
    buf = bytearray(seed)
    for _unused in range(rng.randint(1, 4)):
        pos = rng.randrange(len(buf)) if rng.random() < 0.6 else rng.choice((0, 0x08, 0x30, 0x34, 0x48, 0x180, 0x188,
                                                                             0x1A0, 0x1F8, 0x2A0, 0x330))
        buf[pos] = rng.choice((buf[pos] ^ (1 << rng.randrange(8)), 0, 0xFF, rng.randrange(256)))
    return bytes(buf)


def _snp_report_runner() -> Callable[[bytes], Any]:
    """parse_report, then verify_report against the signer of the seed with the same chip (a cached chain)."""
    signers = {}
    for vec in _snp_vectors():
        signers.setdefault(vec.report[0x1A0:0x1E0], vec)
    cache = sev_snp.ChainCache()

    def run(data: bytes) -> Any:
        report = sev_snp.parse_report(data)
        vec = signers.get(report.chip_id) or next(iter(signers.values()))
        return sev_snp.verify_report(report, vec.signer, vec.chain, now=vec.now, cache=cache)
    return run


def _snp_cert_table_seeds() -> List[bytes]:
    from cryptography.hazmat.primitives import serialization

    seeds = []
    for vec in _snp_vectors():
        chain = sev_snp.load_certificates(vec.chain, "chain")
        der = {vec.kind: sev_snp.load_certificate(vec.signer, vec.kind).public_bytes(serialization.Encoding.DER)}
        for cert in chain:
            der["ark" if cert.subject == cert.issuer else "ask"] = cert.public_bytes(serialization.Encoding.DER)
        seeds.append(sev_snp.build_cert_table(der))
    return seeds


def _parse_snp_cert_table(data: bytes) -> Any:
    """The table, then each certificate in it as verify_report loads it."""
    table = sev_snp.parse_cert_table(data)
    return [sev_snp.load_certificate(der, name) for name, der in table.items()]


def _snp_policy_seeds() -> List[dict]:
    from cryptography.hazmat.primitives import serialization

    from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as snp_vectors

    seeds = []
    for vec in _snp_vectors()[:2]:
        report = sev_snp.parse_report(vec.report)
        seeds.append(snp_vectors.matching_policy(report))
        ark = sev_snp.load_certificates(vec.chain, "chain")[-1]
        seeds.append(snp_vectors.matching_policy(report, launchMeasurement=[report.measurement.hex(), "00" * 48],
                                                 fmcVersion=1, amdRootKey=ark.public_bytes(
                                                     serialization.Encoding.PEM).decode()))
    return seeds


def _snp_document_seeds() -> List[dict]:
    """``sev-snp`` documents around each real report (attestation/snp.py's format; the signer as PEM)."""
    import ssl

    seeds = []
    for vec in _snp_vectors():
        signer = vec.signer if b"-----BEGIN" in vec.signer else ssl.DER_cert_to_PEM_cert(vec.signer).encode()
        info = {"ReportSigner": _b64(signer), "CertChain": _b64(vec.chain), "AttestationReport": _b64(vec.report),
                "Azure": None, "GCP": None}
        seeds.append({"InstanceInfo": _b64(json.dumps(info).encode()), "UserData": _b64(b"fuzz user data")})
    return seeds


def _mutate_snp_document(seed: dict, rng: random.Random) -> bytes:
    """The outer document (as JSON or bytes), the InstanceInfo inside it (its tree), or the report inside that."""
    roll = rng.random()
    if roll >= 0.6:
        return _json_or_bytes()(seed, rng)
    info = json.loads(base64.b64decode(seed["InstanceInfo"]))
    if roll < 0.2:
        info["AttestationReport"] = _b64(_mutate_report(base64.b64decode(info["AttestationReport"]), rng))
        inner = json.dumps(info).encode()
    else:
        inner = dumps(mutate_tree(info, rng)).encode("utf-8", "surrogatepass")
    return json.dumps(dict(seed, InstanceInfo=_b64(inner))).encode()


def _snp_document_runner() -> Callable[[bytes], Any]:
    """The sev-snp validator's steps before the nonce binding (which no real report can meet): the strict
    document, the report, its chain (at a moment inside the seed's validity, by chip ID)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import snp

    nows = {vec.report[0x1A0:0x1E0]: vec.now for vec in _snp_vectors()}
    cache = sev_snp.ChainCache()

    def run(data: bytes) -> Any:
        report, signer, chain, _user_data = snp.decode_document(data)
        parsed = sev_snp.parse_report(report)
        now = nows.get(parsed.chip_id) or next(iter(nows.values()))
        return sev_snp.verify_report(parsed, signer, chain, now=now, cache=cache)
    return run


def make_targets(corpus: Corpus) -> List[Target]:
    """Every parser of untrusted data, with its seeds (see the module doc)."""
    document_tree = json.loads(corpus.document)
    policy_tree = corpus.policy.to_dict()
    kms_uri = kms.MasterSecret(KMS_KEY, KMS_SALT).to_uri()
    uri_seeds = [kms_uri, kms.NO_STORE_URI,
                 kms.format_kms_uri("aws", region="eu-central-1", accessKeyID="AKIAEXAMPLE", accessKey="abc/def+ghi", keyName="kek"),
                 kms.format_kms_uri("azure", tenantID="t", clientID="c", clientSecret="s3cr3t~.x", vaultName="v",
                                    vaultType="vault.azure.net", keyName="k"),
                 kms.format_storage_uri("gcp", projectID="p", bucket="b", credentialsPath="/c.json"),
                 "kms:/cluster-kms?key=%s&salt=%s" % tuple(base64.urlsafe_b64encode(v).decode() for v in (KMS_KEY, KMS_SALT)),
                 "kms://cluster-kms&key=%s" % base64.urlsafe_b64encode(KMS_KEY).decode()]
    secret_json = kms.MasterSecret(KMS_KEY, KMS_SALT).to_json()
    policy_run, policy_cleanup = _file_runner("policy", load_policy_file)
    config_run, config_cleanup = _file_runner("agent-config", AgentConfig.load)
    return [
        Target("attestation_document", _validate_document(corpus), [document_tree], _json_or_bytes(0.8)),
        Target("event_log", eventlog.parse, [corpus.event_log], mutate_bytes),
        Target("tpm_structures", _parse_tpm_structures, _quote_parts(document_tree), mutate_bytes),
        Target("measurements", Measurements.loads, [policy_tree, {str(k): v["expected"] for k, v in policy_tree.items()},
                                                    dict(policy_tree, snp=_snp_policy_seeds()[0])], _json_or_bytes()),
        Target("policy_file", policy_run, [policy_tree] * 24 + list(YAML_SPECIALS), _yaml_or_json, cleanup=[policy_cleanup]),
        Target("rpc_frames", parse_frames, _frame_seeds(), _mutate_frames, _kms_secrets()),
        Target("join_ticket", lambda data: JoinTicket.from_dict(load_json(data, "ticket")), [_ticket_seed()], _json_or_bytes()),
        Target("kms_uri", _parse_any_uri, uri_seeds, _mutate_uri, _kms_secrets()),
        Target("master_secret", kms.MasterSecret.from_json, [json.loads(secret_json)], _json_or_bytes(0.6), _kms_secrets()),
        Target("kubelet_csr", lambda data: check_kubelet_csr(data, CSR_NODE_VPN_IP), _csr_seeds(), mutate_bytes),
        Target("agent_config", config_run, [_agent_config_seed()] * 24 + list(YAML_SPECIALS), _yaml_or_json,
               cleanup=[config_cleanup]),
        Target("sev_snp_report", _snp_report_runner(), [vec.report for vec in _snp_vectors()], _mutate_report),
        Target("sev_snp_cert_table", _parse_snp_cert_table, _snp_cert_table_seeds(), mutate_bytes),
        Target("sev_snp_document", _snp_document_runner(), _snp_document_seeds(), _mutate_snp_document),
        Target("sev_snp_policy", lambda data: sev_snp.SNPPolicy.from_dict(load_json(data, "snp")), _snp_policy_seeds(),
               _json_or_bytes()),
    ]
