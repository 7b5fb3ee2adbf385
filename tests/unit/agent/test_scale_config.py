# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent settings for scale: activation_workers (bounded) and ak_alg (rsa or ecc)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms

from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.core.activation import (
    ACTIVATION_WORKERS,
    MAX_ACTIVATION_WORKERS,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError

BASE = {"state_dir": "/nonexistent", "public_endpoint": "10.0.0.1:9000", "variant": "dummy",
        "insecure_unauthenticated_activation": True}  # these tests are about other keys


def test_defaults_keep_rsa_and_sixteen_workers():
    config = AgentConfig.from_mapping(BASE)
    assert config.ak_alg == "rsa" and config.activation_workers == ACTIVATION_WORKERS == 16


@pytest.mark.parametrize("workers", [1, 32, MAX_ACTIVATION_WORKERS])
def test_activation_workers_within_bounds(workers):
    assert AgentConfig.from_mapping(dict(BASE, activation_workers=workers)).activation_workers == workers


@pytest.mark.parametrize("workers", [0, MAX_ACTIVATION_WORKERS + 1, True, "8"])
def test_activation_workers_out_of_bounds_are_refused(workers):
    with pytest.raises(InputError, match="activation_workers"):
        AgentConfig.from_mapping(dict(BASE, activation_workers=workers))


def test_ak_alg_is_rsa_or_ecc():
    assert AgentConfig.from_mapping(dict(BASE, ak_alg="ecc")).ak_alg == "ecc"
    for wrong in ("dsa", "ECC", 1):
        with pytest.raises(InputError, match="ak_alg"):
            AgentConfig.from_mapping(dict(BASE, ak_alg=wrong))


def test_the_coordinator_activates_at_most_activation_workers_nodes_at_once(swtpm, make_core):
    core, _vpn = make_core(swtpm)
    core.recovery.load()
    pem = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    core.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
    core.activation.activation_workers = 3
    lock = threading.Lock()
    running, peak = [0], [0]

    def connect_node(endpoint):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)  # hold the slot, so that concurrent activations overlap
        with lock:
            running[0] -= 1
        raise ConstellationError("cannot connect to %s (test)" % endpoint)

    rows = core.activation.activate_nodes(["10.42.0.%d:9000" % i for i in range(20, 32)], connect_node)
    assert len(rows) == 12 and not any(r["ok"] for r in rows)
    assert peak[0] == 3
