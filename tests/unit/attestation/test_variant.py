"""Variant names and OIDs (docs/attestation.md, "Variants and their OIDs"), looked up through the chooser, the one registry."""

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, variant
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


def test_constellation_oids():
    assert choose.spec("qemu-vtpm").variant == variant.QEMU_VTPM
    assert choose.spec("qemu-vtpm").oid == "1.3.9900.5.1"
    assert choose.spec("dummy").oid == "1.3.9900.1.1"


# Constellation's OIDs (docs/attestation.md, "Variants and their OIDs"), implemented here or not.
CONSTELLATION_OIDS = {"1.3.9900.1.1", "1.3.9900.2.1", "1.3.9900.2.2", "1.3.9900.3.1", "1.3.9900.3.2",
                      "1.3.9900.4.1", "1.3.9900.4.2", "1.3.9900.4.3", "1.3.9900.5.1", "1.3.9900.5.99"}


def test_our_ek_variant_is_known_without_its_module_and_never_reuses_a_constellation_oid():
    ek = choose.spec("qemu-vtpm-ek")
    assert ek.name == "qemu-vtpm-ek"
    assert ek.oid == "1.3.9900.5.100"
    assert ek.variant.alias_oids == ("2.25.48000548495140104094697751808415705683",)
    assert not set(ek.variant.oids) & CONSTELLATION_OIDS
    assert ek.module == choose.PACKAGE + ".ek"  # imported only when the variant is used


def test_an_alias_is_read_by_the_validator_and_never_issued():
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import ek

    assert ek.VTPMEKIssuer.oid == "1.3.9900.5.100" and not hasattr(ek.VTPMEKIssuer, "alias_oids")
    for validator in (ek.VTPMEKValidator, ek.EnrollmentValidator):
        assert variant.accepts(validator, "1.3.9900.5.100")
        assert variant.accepts(validator, choose.QEMU_VTPM_EK_OLD_OID)
        assert not variant.accepts(validator, "1.3.9900.5.1")
    assert not variant.accepts(choose.spec("qemu-vtpm").implementation().VTPMValidator, choose.QEMU_VTPM_EK_OLD_OID)


def test_unknown_variant_names_the_field_and_the_choices():
    with pytest.raises(InputError) as err:
        choose.spec("azure-sev-snp-typo", "attestation_variant")
    assert "attestation_variant" in str(err.value) and "qemu-vtpm" in str(err.value)


def test_register_refuses_a_taken_oid():
    with pytest.raises(ValueError, match="OID 1.3.9900.5.1 already belongs to qemu-vtpm"):
        choose.register(choose.VariantSpec(variant.Variant("impostor", "1.3.9900.5.1"), "an impostor", __name__))
    assert "impostor" not in choose.names()


@pytest.mark.parametrize("oid, aliases", [
    (choose.QEMU_VTPM_EK_OLD_OID, ()),  # another variant's alias is taken too: never given away
    ("1.3.9900.77.2", (choose.QEMU_VTPM_EK_OID,)),
    ("1.3.9900.77.2", ("1.3.9900.5.1",)),
], ids=["issued-as-an-alias", "alias-of-an-issued", "alias-of-constellations"])
def test_register_refuses_an_oid_taken_as_an_alias_or_issued(oid, aliases):
    with pytest.raises(ValueError, match="already belongs to qemu-vtpm"):
        choose.register(choose.VariantSpec(variant.Variant("impostor", oid, aliases), "an impostor", __name__))
    assert "impostor" not in choose.names()


def test_built_in_variants_cannot_be_unregistered():
    with pytest.raises(ValueError):
        choose.unregister("qemu-vtpm")
    assert "qemu-vtpm" in choose.names()
