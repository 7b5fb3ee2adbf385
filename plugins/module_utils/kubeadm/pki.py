# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubelet's serving certificate, signed with the cluster CA (docs/kubeadm.md, "Join inside the chain of trust").

The API server verifies kubelets against the cluster CA (``kubelet-certificate-authority``), so a
kubelet's self-signed serving certificate would break ``kubectl logs``/``exec``. Constellation's
bootstrapper signs the first kubelet's certificate locally right after ``kubeadm init phase certs``;
the JoinService signs the CSRs of joining nodes the same way. Both sides live here: ``kubelet_csr``
makes the key and the CSR, ``sign_kubelet_csr`` checks a CSR as the JoinService does and signs it.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - reported by the modules via HAS_CRYPTOGRAPHY
    pass

try:
    import yaml
except ImportError:  # pragma: no cover - reported by the modules via HAS_YAML
    pass

NODES_GROUP = "system:nodes"
NODE_CN_PREFIX = "system:node:"
MASTERS_GROUP = "system:masters"
# JoinService: valid from 2 hours ago (clock skew) for one year.
KUBELET_CERT_BACKDATE = datetime.timedelta(hours=2)
KUBELET_CERT_VALIDITY = datetime.timedelta(days=365)


@dataclass
class KubeletKeyPair:
    """A kubelet key (PEM ``EC PRIVATE KEY``, as Constellation writes it) and its CSR (PEM)."""

    csr_pem: bytes
    key_pem: bytes = field(repr=False)


def kubelet_csr(node_name: str, ips: Sequence[str]) -> KubeletKeyPair:
    """An ECDSA P-256 key and a CSR for ``system:node:<node_name>`` in ``system:nodes`` with the node's
    IPs (and its name) as subject alternative names."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(node_name)] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODES_GROUP),
                                    x509.NameAttribute(NameOID.COMMON_NAME, NODE_CN_PREFIX + node_name)]))
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    return KubeletKeyPair(csr_pem=csr.public_bytes(serialization.Encoding.PEM), key_pem=key_pem)


def _refused(what: str) -> InputError:
    return InputError("certificate_request", what)


def load_kubelet_csr(csr_data: bytes):
    """A kubelet's CSR, parsed and checked: a PKCS#10 request (PEM or DER) whose signature holds, exactly
    one O ``system:nodes`` and one CN ``system:node:<name>``. Returns (csr, name). Whatever is wrong with
    it, the error is an InputError naming ``certificate_request`` (the bytes come from a node)."""
    if not isinstance(csr_data, bytes) or not csr_data:
        raise _refused("a PKCS#10 certificate signing request (PEM or DER)")
    try:
        if csr_data.lstrip().startswith(b"-----"):
            csr = x509.load_pem_x509_csr(csr_data)
        else:
            csr = x509.load_der_x509_csr(csr_data)
    except (ValueError, x509.InvalidVersion):
        raise _refused("a PKCS#10 certificate signing request (PEM or DER)") from None
    try:
        valid = csr.is_signature_valid  # parses the public key: a malformed one raises ValueError
        orgs = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        cns = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise _refused("a CSR with a well-formed public key and subject") from None
    if not valid:
        raise _refused("a CSR whose signature verifies")
    if orgs != [NODES_GROUP]:
        raise InputError("certificate_request", "exactly one organization %s" % NODES_GROUP, orgs)
    if len(cns) != 1 or not isinstance(cns[0], str) or not cns[0].startswith(NODE_CN_PREFIX) \
            or len(cns[0]) == len(NODE_CN_PREFIX):
        raise InputError("certificate_request", "one common name %s<node name>" % NODE_CN_PREFIX, cns)
    return csr, cns[0][len(NODE_CN_PREFIX):]


def csr_subject_alt_names(csr) -> list:
    """The CSR's subject alternative names (none: empty); a malformed extension is an InputError."""
    try:
        return list(csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return []
    except (ValueError, TypeError, UnsupportedAlgorithm, x509.DuplicateExtension, x509.UnsupportedGeneralNameType):
        raise _refused("a CSR with well-formed extensions") from None


def sign_kubelet_csr(csr_data: bytes, ca_cert_pem: bytes, ca_key_pem: bytes,
                     now: Optional[datetime.datetime] = None, sans: Optional[Sequence] = None,
                     validity: Optional[datetime.timedelta] = None) -> bytes:
    """The kubelet certificate for a CSR, signed by the cluster CA, as Constellation's JoinService signs it:
    the CSR's signature must hold, its subject must be exactly one O ``system:nodes`` and a CN
    ``system:node:<name>``; the certificate carries the CSR's subject and SANs, digitalSignature and
    keyEncipherment, clientAuth and serverAuth, valid from 2 hours ago for one year. Returns PEM.
    ``sans`` (x509 general names), when given, replace the CSR's: the signer names the node as it knows it.
    ``validity``, when given, replaces the year (the Coordinator's kubelet certificates: days)."""
    csr, _name = load_kubelet_csr(csr_data)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(csr.subject).issuer_name(ca_cert.subject).public_key(csr.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - KUBELET_CERT_BACKDATE).not_valid_after(now + (validity or KUBELET_CERT_VALIDITY))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, content_commitment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]),
                              critical=False))
    if sans is None:
        sans = csr_subject_alt_names(csr)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def issued_by(cert, ca_cert) -> bool:
    """Whether ``cert`` (x509.Certificate) carries a valid signature of ``ca_cert``."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def kubelet_cert_current(cert_pem: bytes, key_pem: bytes, ca_cert_pem: bytes, node_name: str,
                         ips: Sequence[str]) -> bool:
    """Whether an existing kubelet certificate is the one we would make: issued by this CA for this node
    and these IPs, still valid, and belonging to this key (so a re-run signs nothing new)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound):
        return False
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    same_key = (key.public_key().public_bytes(serialization.Encoding.DER, pub)
                == cert.public_key().public_bytes(serialization.Encoding.DER, pub))
    wanted_ips = sorted(ipaddress.ip_address(ip) for ip in ips)
    now = datetime.datetime.now(datetime.timezone.utc)
    return (same_key and issued_by(cert, ca_cert)
            and cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == NODE_CN_PREFIX + node_name
            and sorted(sans.get_values_for_type(x509.IPAddress)) == wanted_ips
            and node_name in sans.get_values_for_type(x509.DNSName)
            and cert.not_valid_after_utc > now)


def kubeconfig_client_identity(kubeconfig_text: str, ca_cert_pem: Optional[bytes] = None) -> dict:
    """The user of a kubeconfig's current context: ``{"user", "common_name", "organizations", "ca_pem"}``.

    With ``ca_cert_pem`` the client certificate must be issued by that CA and the kubeconfig must carry that
    CA; otherwise InputError. Used to decide whether the ``<clusterName>-admin`` kubeconfig on a node is
    still the cluster's."""
    try:
        doc = yaml.safe_load(kubeconfig_text) or {}
        context_name = doc.get("current-context")
        context = next(c["context"] for c in doc["contexts"] if c["name"] == context_name)
        user = next(u for u in doc["users"] if u["name"] == context["user"])
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
        cert = x509.load_pem_x509_certificate(base64.b64decode(user["user"]["client-certificate-data"]))
        ca_pem = base64.b64decode(cluster["certificate-authority-data"])
    except (yaml.YAMLError, KeyError, TypeError, ValueError, StopIteration, AttributeError):
        raise InputError("kubeconfig", "a kubeconfig with a current context, client certificate and CA data") from None
    if ca_cert_pem is not None:
        ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
        if x509.load_pem_x509_certificate(ca_pem) != ca_cert or not issued_by(cert, ca_cert):
            raise InputError("kubeconfig", "a kubeconfig of the cluster whose CA is given (it belongs to another CA)")
    return {
        "user": context["user"],
        "common_name": [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)][0],
        "organizations": [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)],
        "ca_pem": ca_pem,
    }
