# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measured agent (docs/attestation.md, "The agent's PCR"): what the node agent extends into PCR 13
before it serves anything, and the value every validator expects there.

Two events, in this order, each a SHA-256 digest extended into the SHA-256 bank (TPM2_PCR_Extend):

1. ``agent_code``: SHA-256 of the agent's code, the lines ``<relative path> <sha256 hex>\\n`` of every ``*.py``
   file under the collection's ``plugins/module_utils`` (what the node_agent role's archive holds), sorted by path;
2. ``agent_config``: SHA-256 of the canonical JSON of the agent's *trust configuration*, what decides which
   attestation keys it accepts: the attestation variant and the EK trust anchors (SHA-256 of each CA certificate,
   sorted; none for variants without EK roots).

PCR 13 = SHA-256(SHA-256(0^32 || code) || config), replayable from the two events the agent logs
(``agent_measured``) and reports in GetState. Host-specific settings (addresses, ports, paths, intervals, the
per-host init secret hash) are not measured: the same value holds on every peer of a cluster, so one policy entry
covers all of them. The measurements policy is not measured: it holds PCR 13's expected value, and its signature is
checked against the pinned key when it is loaded (a host may hold a signed or an unsigned copy of one policy).

Which values pass on PCR 13 (``enforce_agent_pcr``, the one rule of every validator: the Coordinator, the
controller's actions, the atls connection and the agent): those of the ``agents`` the signed measurements document
lists, by name (attestation/measurements.py), in every set; a document that lists none accepts only the value the
validator computes itself from the code it runs and the trust configuration it was given (OWN_AGENT). A set's own
entry for PCR 13 is replaced (Constellation's images list it as reserved, zero, warn-only) - except an enforced
entry of 32 zero bytes: that is an image set (attestation/deployment.py ``image``: the node image's agent never
extends PCR 13, the boot chain measures it), kept as it is. So a cluster runs the agents its document names - two
during an agent upgrade - and the images whose sets it holds; a changed agent file or trust setting that no entry
names yields another value: the host is refused at activation and evicted by re-attestation. A host peer (PCR 13
extended) never passes an image set, and an image peer (PCR 13 zero) never passes a host set.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

MEASURED_CONFIG_VERSION = 1
_MODULE_UTILS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CACHE: Dict[str, bytes] = {}
# The name of the agent a validator accepts where the measurements document lists no ``agents``: its own value.
OWN_AGENT = "self"  # measurements.RESERVED_AGENT_NAME: no document entry may take it
AGENT_LABEL = "the agent"
IMAGE_AGENT_LABEL = "an image set: the image's agent never extends it"
# What a peer runs on PCR 13 where it matched an image set's zero (no document name can take it: not a valid name).
IMAGE_AGENT = "(image)"


def code_root() -> str:
    """The ``plugins/module_utils`` folder this code runs from (what the agent measures about itself)."""
    return _MODULE_UTILS


def code_digest(root: Optional[str] = None) -> bytes:
    """SHA-256 of the agent's code under ``root`` (default: the running code), as the module docstring says."""
    root = os.path.abspath(root or _MODULE_UTILS)
    cached = _CACHE.get(root)
    if cached is not None:
        return cached
    entries: List[Tuple[str, str]] = []
    if not os.path.isdir(root):
        raise AttestationError("the agent's code folder %s does not exist (cannot measure the agent)" % root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    entries.append((os.path.relpath(path, root).replace(os.sep, "/"), hashlib.sha256(handle.read()).hexdigest()))
    listing = "".join("%s %s\n" % entry for entry in sorted(entries))
    digest = hashlib.sha256(listing.encode("utf-8")).digest()
    _CACHE[root] = digest
    return digest


def measured_config(variant: str, ek_ca_certs: Sequence[Any] = ()) -> Dict[str, Any]:
    """The trust configuration that is measured: ``ek_ca_certs`` (cryptography certificates, the Trust's
    ``ek_ca_certs``: the self-signed anchors and the intermediates beside them)."""
    from cryptography.hazmat.primitives import serialization

    anchors = sorted(hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest() for cert in ek_ca_certs)
    return {"version": MEASURED_CONFIG_VERSION, "variant": variant, "ek_ca_sha256": anchors}


def config_digest(config: Dict[str, Any]) -> bytes:
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode("utf-8")).digest()


def extend(old: bytes, digest: bytes) -> bytes:
    """What TPM2_PCR_Extend does to a SHA-256 PCR."""
    return hashlib.sha256(old + digest).digest()


@dataclass(frozen=True)
class AgentMeasurement:
    """The agent's two events and the PCR value they give."""

    code: bytes
    config: bytes

    @classmethod
    def of(cls, variant: str, ek_ca_certs: Sequence[Any] = (), root: Optional[str] = None) -> "AgentMeasurement":
        return cls(code_digest(root), config_digest(measured_config(variant, ek_ca_certs)))

    @property
    def events(self) -> List[Tuple[str, bytes]]:
        return [("agent_code", self.code), ("agent_config", self.config)]

    @property
    def value(self) -> bytes:
        value = bytes(32)
        for _name, digest in self.events:
            value = extend(value, digest)
        return value

    def to_dict(self) -> Dict[str, Any]:
        return {"pcr": PCR_INDEX_AGENT, "value": self.value.hex(),
                "events": [{"event": name, "digest": digest.hex()} for name, digest in self.events]}


def replay(events: Sequence[Dict[str, str]]) -> bytes:
    """PCR 13 from an event list as ``AgentMeasurement.to_dict`` writes it (verify.yml replays it)."""
    value = bytes(32)
    for event in events:
        value = extend(value, bytes.fromhex(event["digest"]))
    return value


def is_image_set(measurements) -> bool:
    """Whether a set (a Measurements) is a node image's: it enforces PCR 13 explicitly at 32 zero bytes, the value
    of a PCR nothing extended (the image's agent does not measure itself: attestation/deployment.py)."""
    entry = measurements.pcrs.get(PCR_INDEX_AGENT)
    return (entry is not None and not entry.warn_only and entry.expected == bytes(32)
            and all(value == bytes(32) for _name, value in entry.alternatives))


def enforce_agent_pcr(policy, own_value: bytes):
    """``policy`` (a Measurements, or each set of a MeasurementSets) with PCR 13 enforced at the value of any agent
    the document accepts (its ``agents``: a named alternative each, so a match says which agent the peer runs), or
    at ``own_value`` - what the validator's own code and trust configuration give - when it lists none. A set's
    own PCR 13 entry is replaced, unless it is an image set's (``is_image_set``: kept, the peer's PCR 13 must be
    zero); the result is what validators compare, never what is sealed to."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
        Measurement, accepted_agents, per_set)

    agents = accepted_agents(policy)
    if agents:
        alternatives = tuple((name, agent.value) for name, agent in agents.items())
        expectation = Measurement(alternatives[0][1], False, alternatives, AGENT_LABEL)
    else:
        expectation = Measurement(own_value, False)
    image_expectation = Measurement(bytes(32), False, (), IMAGE_AGENT_LABEL)

    def one(measurements):
        pcrs = dict(measurements.pcrs)
        pcrs[PCR_INDEX_AGENT] = image_expectation if is_image_set(measurements) else expectation
        return measurements.with_pcrs(pcrs)

    return per_set(policy, one)


def matched_agent(checks) -> Optional[str]:
    """The agent a validation's table says the peer runs: the name of the accepted agent its PCR 13 matched,
    OWN_AGENT where the document lists none, IMAGE_AGENT where it matched an image set's zero (an image's agent
    measures nothing into PCR 13: its boot chain covers it); None when PCR 13 was not checked or did not match."""
    for check in checks or ():
        if check.index == PCR_INDEX_AGENT:
            if not check.ok:
                return None
            return IMAGE_AGENT if check.found == bytes(32).hex() else (check.matched or OWN_AGENT)
    return None


def running_agent(validation) -> Optional[Tuple[str, bytes]]:
    """(name, PCR 13 value) of the accepted agent a successful validation (attestation/variant.py) matched."""
    name = matched_agent(validation.checks)
    value = validation.pcrs.get(PCR_INDEX_AGENT)
    return (name, value) if name is not None and value is not None else None


def accepted_values(policy, own_value: Optional[bytes]) -> Dict[str, bytes]:
    """The PCR 13 values ``policy`` accepts, by agent name (``enforce_agent_pcr``'s rule): its ``agents``, else
    OWN_AGENT at ``own_value`` ({} when that is unknown)."""
    agents = getattr(policy, "agents", None) or {}
    if agents:
        return {name: agent.value for name, agent in agents.items()}
    return {OWN_AGENT: own_value} if own_value is not None else {}


def measure(tpm, measurement: AgentMeasurement) -> str:
    """Extends PCR 13 of ``tpm`` (attestation/tpm.py's TPM) with the agent's events, once per boot:
    ``"measured"``; ``"already"`` when PCR 13 already holds exactly this measurement (the agent restarted
    without a reboot); ``"conflict"`` when it held something else (another agent or configuration ran since
    the boot: the extension still happens, and no policy accepts the result until the host reboots)."""
    current = tpm.pcr_read("sha256", [PCR_INDEX_AGENT])[PCR_INDEX_AGENT]
    if current == measurement.value:
        return "already"
    for _name, digest in measurement.events:
        tpm.pcr_extend(PCR_INDEX_AGENT, digest)
    return "measured" if current == bytes(32) else "conflict"


# -- An agent's value computed elsewhere than on the agent (the agent_measurement module) ----------------------
# The code digest above is what an agent measures about the code it runs. An operator computes the same value for
# an agent that is not running yet (a release to accept before the upgrade) from its source tree or from the
# archive the node_agent role builds and unpacks on the host.

MAX_ARCHIVE_MEMBERS = 4096
MAX_ARCHIVE_BYTES = 64 * 1024 * 1024  # uncompressed code: the collection's module_utils is well under 2 MiB


def source_code_root(src: str, field: str = "src") -> str:
    """The agent's code folder of a source tree: ``src/plugins/module_utils`` when ``src`` is a collection's root,
    else ``src`` itself (a ``module_utils`` folder). InputError naming ``field`` when it is no folder."""
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

    if not isinstance(src, str) or not os.path.isdir(src):
        raise InputError(field, "a collection's root (holding plugins/module_utils) or a module_utils folder", src)
    nested = os.path.join(src, "plugins", "module_utils")
    return nested if os.path.isdir(nested) else src


def source_code_digest(src: str, field: str = "src") -> bytes:
    """``code_digest`` of a source tree (``source_code_root``)."""
    return code_digest(source_code_root(src, field))


def _archive_member_path(member: Any, field: str) -> str:
    """The relative path a member unpacks to; InputError for anything the agent's archive never holds."""
    import posixpath

    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

    name = member.name
    if not member.isfile():
        kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
                "a device" if member.ischr() or member.isblk() else "a folder" if member.isdir() else
                "a FIFO" if member.isfifo() else "a non-regular member")
        raise InputError(field, "an agent code archive of regular files only (the node_agent role's)",
                         "%s is %s" % (name, kind))
    if name.startswith("/") or "\\" in name:
        raise InputError(field, "member paths relative to plugins/module_utils", name)
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise InputError(field, "member paths relative to plugins/module_utils, without ..", name)
    return posixpath.join(*parts)


def archive_code_digest(archive: Any, field: str = "archive") -> bytes:
    """``code_digest`` of the agent's code in a gzipped tar archive whose members are paths relative to
    ``plugins/module_utils`` (what roles/node_agent/tasks/main.yml builds and the host unpacks), computed from the
    members' bytes: nothing is extracted. ``archive``: a path or a binary file object. Absolute paths, ``..``,
    links, devices, folders and duplicate members are refused (InputError naming ``field``); as on the host after
    unpacking, only ``*.py`` files outside ``__pycache__`` are code."""
    import tarfile
    import zlib

    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

    entries: Dict[str, str] = {}
    total = 0
    try:
        opened = (tarfile.open(archive, "r:gz") if isinstance(archive, (str, bytes, os.PathLike))
                  else tarfile.open(fileobj=archive, mode="r:gz"))
        with opened as tar:
            for count, member in enumerate(tar, 1):
                if count > MAX_ARCHIVE_MEMBERS:
                    raise InputError(field, "an agent code archive of at most %d members" % MAX_ARCHIVE_MEMBERS)
                path = _archive_member_path(member, field)
                if path in entries:
                    raise InputError(field, "each member once", "%s is in the archive twice" % path)
                total += member.size
                if total > MAX_ARCHIVE_BYTES:
                    raise InputError(field, "an agent code archive of at most %d bytes unpacked" % MAX_ARCHIVE_BYTES)
                entries[path] = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise InputError(field, "a readable gzipped tar archive (.tar.gz) of the agent's code",
                         "%s (%s)" % (archive if isinstance(archive, str) else "the archive", err)) from None
    code = sorted((path, sha) for path, sha in entries.items()
                  if path.endswith(".py") and "__pycache__" not in path.split("/"))
    if not code:
        raise InputError(field, "an agent code archive holding the *.py files of plugins/module_utils", "no *.py member")
    return hashlib.sha256("".join("%s %s\n" % entry for entry in code).encode("utf-8")).digest()


def set_agent_entry(document: Dict[str, Any], name: str, entry: Optional[Dict[str, Any]]) -> Tuple[Dict[str, Any], bool]:
    """``document`` (a measurements document as parsed JSON) with the agent ``name`` listed as ``entry`` (what
    ``AgentMeasurement.to_dict`` writes), or retired when ``entry`` is None: ``(new document, changed)``. When it
    changes anything the new document's ``version`` is one above the old one's and a plain policy becomes the named
    form (its PCRs the set ``default``); otherwise the document comes back equal, version unchanged. ``document`` is
    never modified. InputError for a bad name, an entry the document's parser refuses (measurements.AcceptedAgent:
    events that do not replay to the value, ...), or one agent more than a document may list."""
    import copy

    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
        ACCEPTED_KEY, AGENTS_KEY, DEFAULT_SET_NAME, MAX_AGENTS, VERSION_KEY, AcceptedAgent, check_agent_name)
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

    if not isinstance(document, dict):
        raise InputError("measurements_file", "a measurements document (a mapping)", type(document).__name__)
    try:
        check_agent_name(name, "name")
    except InputError as error:
        raise InputError("name", "an agent name of 1-64 characters [A-Za-z0-9._+-], starting with a letter or digit, "
                         "other than 'self'", name) from error
    agents = document.get(AGENTS_KEY) or {}
    if not isinstance(agents, dict):
        raise InputError("measurements_file", "agents: a mapping of agent name to its entry", type(agents).__name__)
    if entry is not None:
        entry = copy.deepcopy(dict(entry))
        AcceptedAgent.from_dict(name, entry)
        if agents.get(name) == entry:
            return copy.deepcopy(document), False
        if name not in agents and len(agents) >= MAX_AGENTS:
            raise InputError("name", "at most %d agents in one document (retire one first)" % MAX_AGENTS, name)
    elif name not in agents:
        return copy.deepcopy(document), False
    version = document.get(VERSION_KEY, 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InputError("measurements_file", "version: an integer >= 0", version)
    if ACCEPTED_KEY in document:
        rest = {k: copy.deepcopy(v) for k, v in document.items() if k not in (VERSION_KEY, AGENTS_KEY)}
    else:  # a plain policy: its PCRs become the set "default", as validators read it (measurements.as_sets)
        rest = {ACCEPTED_KEY: {DEFAULT_SET_NAME: {k: copy.deepcopy(v) for k, v in document.items() if k != VERSION_KEY}}}
    agents = copy.deepcopy(agents)
    if entry is None:
        del agents[name]
    else:
        agents[name] = entry
    out: Dict[str, Any] = {VERSION_KEY: version + 1}
    out.update(rest)
    if agents:
        out[AGENTS_KEY] = agents
    return out, True


def _document_text(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError("measurements_file", "UTF-8 text", "%s: an invalid byte at offset %d" % (path, err.start)) \
            from None


def keep_agent_entry(path: str, name: str, entry: Optional[Dict[str, Any]], key: Any = None, pinned: Any = None,
                     check_mode: bool = False) -> Dict[str, Any]:
    """Lists the agent ``name`` with ``entry`` (None: retires it) in the measurements document at ``path``, signed
    again with ``key`` (a P-256 private key, or None); ``pinned``: the public key the document must already be
    signed with. Returns the results (changed, version, entry, measurements_file, signature_file) and the texts
    ``before``/``after``. Nothing is written in check mode, nor when the document lists the agent as asked already;
    on a failure the old document and signature stay as they were. Errors name the agent_measurement module's
    options."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature as sig
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
        AGENTS_KEY, parse_policy)
    from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_yaml, read_text
    from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

    if key is not None and pinned is not None and not sig.same_public_key(key.public_key(), pinned):
        raise InputError("priv_key_file", "the key whose public half measurements_pub_key_file pins", "another key")
    sig_path = sig.signature_path(path)
    signed = os.path.exists(sig_path)
    if signed and (key is not None or pinned is not None):
        # The document is checked before it is changed: re-signing an altered document would vouch for it.
        data = sig.read_signed_file(path, pinned or key.public_key(), "measurements_file")
    elif pinned is not None:
        raise InputError("measurements_file", "a document signed with the key measurements_pub_key_file pins "
                         "(%s is missing)" % sig_path, path)
    else:
        data = read_text(path, "measurements_file", sig.MAX_SIGNED_FILE,
                         "an existing measurements document (JSON or YAML)").encode("utf-8")
    text = _document_text(data, path)
    document = load_yaml(text, "measurements_file", int_keys=True)  # YAML may spell PCR indices as integers
    new, changed = set_agent_entry(document, name, entry)
    parse_policy(new)  # what every validator will read
    new_text = json.dumps(new, indent=2) + "\n" if changed else text
    sign = key is not None and (changed or not signed)
    if changed and signed and key is None:
        raise InputError("priv_key_file", "the signing key: %s is signed (%s), and changing it without re-signing "
                         "would leave a document no peer accepts" % (path, sig_path), None)
    listed = (new if entry is not None else document).get(AGENTS_KEY) or {}
    result = {"changed": changed or sign, "version": new.get("version", 0), "entry": listed.get(name),
              "measurements_file": path, "signature_file": sig_path if (signed or sign) else None,
              "before": text, "after": new_text}
    if check_mode or not result["changed"]:
        return result
    new_data = new_text.encode("utf-8")
    signature = sig.sign_blob(key, new_data) + "\n" if sign else None
    mode = os.stat(path).st_mode & 0o777
    if changed:
        atomic_write(path, new_data, mode)
    if signature is not None:
        try:
            atomic_write(sig_path, signature.encode("ascii"), 0o644)
        except BaseException:
            if changed:
                atomic_write(path, data, mode)  # the old document again: its old signature still verifies it
            raise
    return result
