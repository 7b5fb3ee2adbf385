# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Property-based fuzzing of every parser of untrusted data.

Each parser returns a valid object or raises one of the project's documented errors, never anything
else, and no error text holds secret material. Inputs are mutations of real documents (targets.py;
the attestation document comes from swtpm) driven by hypothesis, plus arbitrary JSON structures for
the parsers that take a mapping. Deterministic: derandomized, no example database. ``make fuzz``
runs the same targets for 100,000+ inputs each (scripts/fuzz.py).
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import JoinTicket, NodeActivationRequest
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.tests.unit.fuzz.targets import (
    KMS_KEY,
    KMS_SALT,
    ODD_KEYS,
    check,
    encode_frames,
)

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW_FUZZ = settings(FUZZ, max_examples=120)

TARGETS = ("attestation_document", "event_log", "tpm_structures", "measurements", "rpc_frames", "join_ticket", "kms_uri", "master_secret",
           "kubelet_csr", "sev_snp_report", "sev_snp_cert_table", "sev_snp_policy", "sev_snp_document")


def _assert_clean(target, data):
    err = check(target, data)
    assert err is None, "%s: %r on input %r" % (target.name, err, data if len(repr(data)) < 2000 else repr(data)[:2000])


@pytest.mark.parametrize("name", TARGETS)
@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_mutated_real_documents_get_documented_errors_only(targets, name, rng):
    target = targets[name]
    _assert_clean(target, target.input_from(rng))


@pytest.mark.parametrize("name", ("policy_file", "agent_config"))
@SLOW_FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_mutated_yaml_files_get_documented_errors_only(targets, name, rng):
    target = targets[name]
    _assert_clean(target, target.input_from(rng))


def test_seeds_are_accepted(targets, corpus):
    """The corpus is sound: the unmutated seeds parse, so mutations start from accepted documents."""
    assert corpus.validator.validate(corpus.document, bytes(range(32))).user_data == b"fuzz user data"
    assert targets["rpc_frames"].run(encode_frames(targets["rpc_frames"].seeds[1])) == 1
    assert targets["kms_uri"].run(targets["kms_uri"].seeds[0]).derive_key("fuzz")
    assert [targets["kubelet_csr"].run(seed)[0] for seed in targets["kubelet_csr"].seeds] == ["fuzz-node"] * 2
    assert {targets["sev_snp_report"].run(seed).product for seed in targets["sev_snp_report"].seeds} == {"Milan"}
    assert all(targets["sev_snp_cert_table"].run(seed) for seed in targets["sev_snp_cert_table"].seeds)
    assert all(targets["sev_snp_policy"].run(json.dumps(seed).encode()) for seed in targets["sev_snp_policy"].seeds)
    assert {targets["sev_snp_document"].run(json.dumps(seed).encode()).signing_key
            for seed in targets["sev_snp_document"].seeds} == {"vcek", "vlek"}


# Arbitrary JSON (and YAML-like: integer, boolean, float keys) structures for the parsers of mappings.
_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70) | st.floats()
            | st.text(max_size=20) | st.sampled_from(ODD_KEYS))
_KEYS = st.sampled_from(ODD_KEYS) | st.text(max_size=8) | st.integers(-2, 30) | st.booleans() | st.none() | st.floats()
JSONISH = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
                       max_leaves=20)


def _documented_only(parse, value):
    try:
        parse(value)
    except ConstellationError:
        pass


@FUZZ
@given(value=st.dictionaries(_KEYS, JSONISH, max_size=6) | JSONISH)
def test_measurements_from_any_structure(value):
    _documented_only(Measurements.from_dict, value)


@FUZZ
@given(value=st.dictionaries(st.sampled_from(("state_dir", "public_endpoint", "public_ip", "tcti", "variant", "measurements",
                                              "ek_ca", "store", "vpn_interface", "vpnapi_port", "update_interval",
                                              "vpn_cidr", "vpn_listen_port", "wg_listen_port", "wg_interface", "log_level")) | _KEYS,
                             JSONISH, max_size=8))
def test_agent_config_from_any_mapping(value):
    _documented_only(AgentConfig.from_mapping, value)


@FUZZ
@given(value=st.dictionaries(st.sampled_from(("node_vpn_ip", "peers", "cluster_id", "measurement_salt", "admin_pub_key",
                                              "coordinator_vpn_ip", "measurement_secret", "state_disk_key", "kubeadm")),
                             JSONISH, max_size=9))
def test_join_ticket_from_any_mapping(value):
    _documented_only(JoinTicket.from_dict, value)
    _documented_only(NodeActivationRequest.from_dict, value)


@FUZZ
@given(method=st.sampled_from(sorted(schema.METHODS)), params=JSONISH)
def test_rpc_params_of_any_shape(method, params):
    _documented_only(schema.METHODS[method].request.decode, params)


_KEY_TEXT = base64.urlsafe_b64encode(KMS_KEY).decode()
_SALT_TEXT = base64.urlsafe_b64encode(KMS_SALT).decode()


@FUZZ
@given(prefix=st.sampled_from(("kms://cluster-kms?", "kms:/cluster-kms?", "kms://cluster-kms&", "kms:cluster-kms?",
                               "kms://", "storage://aws?", "", "kms://cluster-kms?key=")),
       names=st.lists(st.sampled_from(("key", "salt", "kye", "Key", "", "key ", "masterSecret", _KEY_TEXT[:12])), min_size=1,
                      max_size=3),
       seps=st.lists(st.sampled_from(("=", "&", "", "==", "%3D", "?", "#", ";")), min_size=3, max_size=3),
       cut=st.integers(0, 44))
def test_kms_uri_errors_never_hold_the_key(prefix, names, seps, cut):
    """Every error path of a cluster-kms URI with a known key and salt: malformed schemes,
    separators, parameter names, truncated values. The key and salt never reach the message."""
    values = (_KEY_TEXT, _SALT_TEXT[:cut] or _SALT_TEXT, _KEY_TEXT[cut:] or _KEY_TEXT)
    uri = prefix + seps[2].join("%s%s%s" % (name, seps[0], values[i % 3]) for i, name in enumerate(names))
    try:
        kms.open_kms(uri)
    except ConstellationError as err:
        text = "%s %r" % (err, err.args)
        for secret in (_KEY_TEXT, _SALT_TEXT, _KEY_TEXT[:13], _KEY_TEXT[-13:], _SALT_TEXT[:13], KMS_KEY.hex()):
            assert secret not in text, uri
