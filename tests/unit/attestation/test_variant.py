"""Variant names and OIDs (SPEC.md 1.6)."""

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import variant
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


def test_constellation_oids():
    assert variant.from_string("qemu-vtpm").oid == "1.3.9900.5.1"
    assert variant.from_string("dummy").oid == "1.3.9900.1.1"


def test_our_ek_variant_loads_on_demand_and_never_reuses_a_constellation_oid():
    ek = variant.from_string("qemu-vtpm-ek")
    assert ek.name == "qemu-vtpm-ek"
    assert not ek.oid.startswith("1.3.9900.")


def test_unknown_variant_names_the_field_and_the_choices():
    with pytest.raises(InputError) as err:
        variant.from_string("azure-sev-snp-typo")
    assert "attestation_variant" in str(err.value) and "qemu-vtpm" in str(err.value)


def test_register_refuses_a_taken_oid():
    with pytest.raises(ValueError):
        variant.register(variant.Variant("impostor", "1.3.9900.5.1"))
