# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's attestation settings in one place: policy, validators, PCR 15.

Every controller-side plugin that attests a peer (verify_attestation, agent_state,
activate_coordinator, activate_nodes, the atls connection) takes the same options; this module
turns them into a ``Measurements`` policy and the validators aTLS needs, with the same errors.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.constants import deprecated_alias
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    DEFAULT_SET_NAME, PCR_INDEX_CLUSTER_ID, Measurement, Measurements, Policy, expected_pcr15, parse_policy, per_set)
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_yaml, read_text
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.netns import check_netns_name

VARIANTS = choose.VARIANT_NAMES
DEFAULT_TIMEOUT = 10.0
DEFAULT_ATTESTATION_TIMEOUT = 30.0


# The options every attesting plugin shares (an Ansible argument spec fragment).
ATTESTATION_ARGUMENT_SPEC: Dict[str, Dict[str, Any]] = dict(
    measurements=dict(type="dict"),
    measurements_file=dict(type="path", aliases=["measurements_path"], deprecated_aliases=[deprecated_alias("measurements_path")]),
    variant=dict(type="str", choices=list(VARIANTS), default=choose.DEFAULT_VARIANT),
    ek_ca_path=dict(type="path"),
    # The SEV-SNP variants: the AMD roots a report must chain to (default: AMD's pinned roots; choose.load_trust).
    amd_roots=dict(type="path"),
    # The acknowledgement variant qemu-vtpm needs (attestation/choose.py check_variant_allowed).
    insecure_trust_any_ak=dict(type="bool", default=False),
    measurements_pub_key_file=dict(type="path", aliases=["measurements_public_key_path"],
                                   deprecated_aliases=[deprecated_alias("measurements_public_key_path")]),
    netns=dict(type="str"),
    timeout=dict(type="float", default=DEFAULT_TIMEOUT),
    attestation_timeout=dict(type="float", default=DEFAULT_ATTESTATION_TIMEOUT),
)
ATTESTATION_MUTUALLY_EXCLUSIVE = [("measurements", "measurements_file")]


def attested_options(options: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The keyword arguments (argument_spec, mutually_exclusive) of an AnsibleModule or ArgumentSpecValidator
    that takes the attestation options and ``options``."""
    return dict(argument_spec=dict(ATTESTATION_ARGUMENT_SPEC, **options), mutually_exclusive=ATTESTATION_MUTUALLY_EXCLUSIVE)


# What PCR 15 says about a peer (docs/attestation.md, "PCR 15 and the cluster ID"): never locked, locked to our cluster, or to another.
FRESH = "fresh"
OURS = "ours"
OTHER = "other"


def enforced_pcrs(policy) -> List[int]:
    """The PCRs a policy enforces about what booted: not warnOnly, and not PCR 15 (the cluster ID,
    which the agent and the controller set themselves: zeros for a fresh node, ignored for a
    Coordinator a node joins, the cluster's own for a member). Of named sets: those every set enforces."""
    common = None
    for measurements in policy.sets.values():
        mine = {i for i, m in measurements.pcrs.items() if not m.warn_only and i != PCR_INDEX_CLUSTER_ID}
        common = mine if common is None else common & mine
    return sorted(common or ())


class PeerPolicies(NamedTuple):
    """What the validators of one variant check (``peer_policies``): ``full`` (members of a cluster, the controller's
    view), ``fresh_node`` (a node a Coordinator activates or lets join: never activated before) and ``coordinator``
    (the Coordinator a node joins, and the nodes the Core activates or resumes: PCR 15 is checked elsewhere);
    ``sealed``: the sets the storage key is sealed to (core/at_rest.py)."""

    full: Optional[Policy]
    fresh_node: Optional[Policy]
    coordinator: Optional[Policy]
    sealed: Optional[Policy]


def fresh_node_policy(policy: Policy) -> Policy:
    """``policy`` plus PCR 15 = zeros (a node that already belongs to a cluster is never activated again). Each
    accepted set alike."""
    def one(measurements: Measurements) -> Measurements:
        pcrs = dict(measurements.pcrs)
        pcrs[PCR_INDEX_CLUSTER_ID] = Measurement(bytes(32), False)
        return measurements.with_pcrs(pcrs)

    return per_set(policy, one)


def coordinator_policy(policy: Policy) -> Policy:
    """``policy`` without PCR 15: PCR 15 of an activated Coordinator holds its cluster ID, which a fresh node cannot
    know yet. Each accepted set alike."""
    return per_set(policy, lambda m: m.with_pcrs({i: v for i, v in m.pcrs.items() if i != PCR_INDEX_CLUSTER_ID}))


def without_pcrs(policy: Policy) -> Policy:
    """``policy`` with no PCR entry left in any set (what a variant that quotes no PCRs checks: the rest of each
    set, its ``snp`` object)."""
    return per_set(policy, lambda m: m.with_pcrs({}))


def peer_policies(variant: str, policy: Optional[Policy], own_agent: Optional[bytes]) -> PeerPolicies:
    """The one rule of which PCR requirements the validators of ``variant`` add to the signed ``policy``
    (docs/attestation.md, "PCR 15 and the cluster ID"). A variant that quotes PCRs (``VariantSpec.quotes_pcrs``):
    the agent's PCR 13 (attestation/agent_measurement.py ``enforce_agent_pcr``, ``own_agent``: the value this agent
    computes for itself, None where the policy lists its agents or the caller enforces nothing there), PCR 15 for
    fresh nodes, the policy's own PCRs for sealing. A variant that quotes none (``sev-snp``): nothing is added, and
    the document's PCR entries are neither checked nor sealed to: every policy is the document's ``snp`` objects
    alone (the storage key is then bound to the TPM only, core/at_rest.py)."""
    if policy is None:
        return PeerPolicies(None, None, None, None)
    if not choose.spec(variant).quotes_pcrs:
        bare = without_pcrs(policy)
        return PeerPolicies(bare, bare, bare, bare)
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement

    full = agent_measurement.enforce_agent_pcr(policy, own_agent) if own_agent is not None else policy
    return PeerPolicies(full, fresh_node_policy(full), coordinator_policy(full), policy)


def require_enforced_pcr(policy: Policy, source: str, field: str = "measurements_file") -> Policy:
    """Refuses a policy that enforces nothing (empty, all warnOnly, or only PCR 15): with it any TPM
    that runs anything would pass. ``source`` names the file (or "inline measurements")."""
    for name, measurements in policy.sets.items():
        if not enforced_pcrs(measurements) and measurements.snp is None:
            raise InputError(field, "a measurements policy that enforces at least one PCR other than %d (warnOnly: "
                             "false), or an snp policy, in every accepted set; an empty, all-warnOnly or PCR-%d-only "
                             "set would accept any TPM" % (PCR_INDEX_CLUSTER_ID, PCR_INDEX_CLUSTER_ID),
                             "%s (enforced: none%s)" % (source, "" if name == DEFAULT_SET_NAME else " in set %s" % name))
    return policy


def load_policy_file(path: str, basedir: Optional[str] = None, public_key_path: Optional[str] = None) -> Policy:
    """A JSON or YAML policy file; a relative path is relative to ``basedir``. With
    ``public_key_path`` the file must carry a valid detached signature (``path.sig``). A policy that
    enforces no PCR is refused, naming the file (require_enforced_pcr)."""
    policy = parse_policy(read_policy_document(path, basedir, public_key_path))
    return require_enforced_pcr(policy, _resolve(path, basedir))


def _resolve(path: str, basedir: Optional[str]) -> str:
    return os.path.join(basedir, path) if basedir and not os.path.isabs(path) else path


def read_policy_document(path: str, basedir: Optional[str] = None, public_key_path: Optional[str] = None) -> Any:
    """The parsed JSON or YAML document of a policy file (not yet checked as a policy).

    The one loader of policy files (site.yml's actions, verify.yml, the atls connection plugin, the
    agent). With ``public_key_path`` (a pinned ECDSA P-256 key, PEM, as cosign.pub) the file's
    detached signature ``path.sig`` (cosign sign-blob form) is checked against the file's exact
    bytes BEFORE anything is parsed; an unsigned or altered file is refused, naming the file.
    Without a key, unsigned files are read as before (the caller decides whether to warn)."""
    path = _resolve(path, basedir)
    if public_key_path:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature

        key = signature.load_public_key_file(_resolve(public_key_path, basedir), "measurements_pub_key_file")
        data = signature.read_signed_file(path, key)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError("measurements_file", "UTF-8 text", "%s: an invalid byte at offset %d" % (path, err.start)) \
                from None
    else:
        text = read_text(path, "measurements_file", expected="a readable JSON or YAML file")
    # JSON is YAML: one loader for both spellings of the policy; bounded, UTF-8 only, and PCR
    # indices may be YAML integers (``4:``) but no other kind of key (``true:``).
    return load_yaml(text, "measurements_file", int_keys=True)


def load_policy(measurements: Optional[Mapping] = None, measurements_file: Optional[str] = None,
                basedir: Optional[str] = None, public_key_path: Optional[str] = None) -> Policy:
    """The policy from inline measurements or a file (exactly one); never empty. With a pinned
    ``public_key_path`` only a signed file is accepted (inline measurements carry no signature)."""
    if measurements is not None and measurements_file:
        raise InputError("measurements", "either measurements or measurements_file, not both", "both")
    if public_key_path and not measurements_file:
        raise InputError("measurements_file", "a signed measurements file: measurements_pub_key_file is set, and "
                         "inline measurements carry no signature", None)
    if measurements_file:
        policy = load_policy_file(measurements_file, basedir, public_key_path)
    elif measurements is not None:
        policy = parse_policy(measurements)
        if not all(m.pcrs or m.snp is not None for m in policy.sets.values()):
            raise InputError("measurements", "at least one PCR: an empty policy would accept any TPM", {})
        require_enforced_pcr(policy, "inline measurements", "measurements")
    else:
        raise InputError("measurements", "a measurements policy (measurements or measurements_file)", None)
    return policy


@dataclass
class AttestationSettings:
    """Validated attestation options of one plugin call."""

    variant: str
    policy: Optional[Policy]
    netns: Optional[str]
    timeout: float
    attestation_timeout: float
    trust: choose.Trust = field(default_factory=choose.Trust)
    # What the caller must show as a warning on every run (an insecure variant, acknowledged).
    warnings: List[str] = field(default_factory=list)

    def validators(self) -> List[Any]:
        """The validators of the chosen variant (attestation/choose.py); for qemu-vtpm-ek they share
        this settings' registry of certified AKs, so one enrollment serves every connection."""
        return [choose.validator(self.variant, self.policy, self.trust)]


def settings_from_args(args: Mapping[str, Any], basedir: Optional[str] = None, agent_pcr: bool = True) -> AttestationSettings:
    """``args``: validated parameters holding the ATTESTATION_ARGUMENT_SPEC options. ``agent_pcr``: the policy
    enforces the agent's PCR 13 (attestation/agent_measurement.py ``enforce_agent_pcr``): the agents the document
    lists, or, where it lists none, the value this collection's agent with this trust configuration measures; only
    code that cannot read the collection's files (a module packed by Ansible) may turn it off."""
    variant = args.get("variant") or choose.DEFAULT_VARIANT
    insecure_trust_any_ak = args.get("insecure_trust_any_ak") is True
    chosen = choose.check_variant_allowed(variant, insecure_trust_any_ak)
    policy = None
    if chosen.needs_policy:
        policy = load_policy(args.get("measurements"), args.get("measurements_file"), basedir,
                             args.get("measurements_pub_key_file"))
    trust = choose.load_trust(variant, args.get("ek_ca_path"), basedir, insecure_trust_any_ak=insecure_trust_any_ak,
                              amd_roots_path=args.get("amd_roots") or None)
    for name in ("timeout", "attestation_timeout"):
        value = args.get(name)
        if value is None or not 0 < float(value) <= 86400:
            raise InputError(name, "seconds in (0, 86400]", value)
    if policy is not None:
        own_agent = None
        if agent_pcr and chosen.quotes_pcrs:
            from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement

            own_agent = agent_measurement.AgentMeasurement.of(variant, trust.ek_ca_certs).value
        policy = peer_policies(variant, policy, own_agent).full
    warning = choose.insecure_warning(variant)
    return AttestationSettings(variant, policy, check_netns_name(args.get("netns")),
                               float(args.get("timeout")), float(args.get("attestation_timeout")), trust,
                               [warning] if warning else [])


def cluster_membership(pcrs: Mapping[int, bytes], cluster_id: Optional[bytes]) -> str:
    """FRESH, OURS or OTHER from the attested PCR 15. Without a cluster ID a locked peer is OTHER
    unless proven otherwise (the caller cannot tell)."""
    pcr15 = pcrs.get(PCR_INDEX_CLUSTER_ID)
    if pcr15 is None:
        raise InputError("pcrs", "a quote covering PCR %d" % PCR_INDEX_CLUSTER_ID, sorted(pcrs))
    if pcr15 == bytes(len(pcr15)):
        return FRESH
    if cluster_id is not None and hmac.compare_digest(pcr15, expected_pcr15(cluster_id)):
        return OURS
    return OTHER


def membership_without_pcrs(state: str, key_accepted: Optional[bool]) -> str:
    """What replaces PCR 15 for a peer whose variant quotes no PCRs (``sev-snp``; docs/attestation.md, "Variant
    `sev-snp` (ours)"): the attested agent's own word on this attested connection. FRESH when it says it awaits
    activation (``state`` AcceptingInit, as GetState names it), OURS when it accepted our admin's or Coordinators'
    key (``key_accepted``: only a peer activated by this cluster pinned it), OTHER otherwise (a refused key, or no key
    tried: the caller cannot tell). The agent keeps its node lock itself (sealed state, and PCR 15 of its local TPM
    where it has one); what proves that it keeps it is the launch measurement covering its code."""
    from ansible_collections.constellation.cluster.plugins.module_utils.constants import STATE_ACCEPTING_INIT

    if state == STATE_ACCEPTING_INIT:
        return FRESH
    return OURS if key_accepted else OTHER


def pcr_mismatch_text(checks) -> str:
    """The failed rows of the per-PCR table, for one line of an error message."""
    rows = []
    for check in checks or []:
        if not check.ok:
            rows.append("PCR %d: expected %s, found %s" % (check.index, check.expected, check.found or "(not quoted)"))
    return "; ".join(rows)


def pcr_rows(checks) -> List[Dict[str, Any]]:
    """The per-PCR table as plain dicts (index, expected, found, warn_only, ok); a PCR with named alternatives (the
    agents a document accepts on PCR 13) adds ``accepted`` (name: value) and ``matched`` (the name, "" when none)."""
    rows = []
    for check in checks or []:
        row = {"index": check.index, "expected": check.expected, "found": check.found,
               "warn_only": check.warn_only, "ok": check.ok}
        if getattr(check, "accepted", None):
            row.update(accepted=dict(check.accepted), matched=check.matched)
        rows.append(row)
    return rows
