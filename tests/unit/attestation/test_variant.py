"""Variant names and OIDs (docs/attestation.md, "Variants and their OIDs"), looked up through the chooser, the one registry."""

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, variant
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


def test_constellation_oids():
    assert choose.spec("qemu-vtpm").variant == variant.QEMU_VTPM
    assert choose.spec("qemu-vtpm").oid == "1.3.9900.5.1"
    assert choose.spec("dummy").oid == "1.3.9900.1.1"


def test_our_ek_variant_is_known_without_its_module_and_never_reuses_a_constellation_oid():
    ek = choose.spec("qemu-vtpm-ek")
    assert ek.name == "qemu-vtpm-ek"
    assert not ek.oid.startswith("1.3.9900.")
    assert ek.module == choose.PACKAGE + ".ek"  # imported only when the variant is used


def test_unknown_variant_names_the_field_and_the_choices():
    with pytest.raises(InputError) as err:
        choose.spec("azure-sev-snp-typo", "attestation_variant")
    assert "attestation_variant" in str(err.value) and "qemu-vtpm" in str(err.value)


def test_register_refuses_a_taken_oid():
    with pytest.raises(ValueError, match="OID 1.3.9900.5.1 already belongs to qemu-vtpm"):
        choose.register(choose.VariantSpec(variant.Variant("impostor", "1.3.9900.5.1"), "an impostor", __name__))
    assert "impostor" not in choose.names()


def test_built_in_variants_cannot_be_unregistered():
    with pytest.raises(ValueError):
        choose.unregister("qemu-vtpm")
    assert "qemu-vtpm" in choose.names()
