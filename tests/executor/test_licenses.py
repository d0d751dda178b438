"""Licences as data (executor.licenses): SPDX ids checked and spelled one way, other licences need
the URL of their terms, a source without one is NOASSERTION, and the licence is identity."""

from dataclasses import dataclass

import pytest

from executor import License, LicensePolicy, Step, VoyageError, step_type
from executor.dag import build_dag
from executor.licenses import NOASSERTION, OPEN_LICENSES, PUBLIC_DOMAIN, declared_license, license_fields


def test_spdx_ids_are_checked_and_written_in_their_canonical_case():
    assert License("cc-by-4.0").id == "CC-BY-4.0"
    assert License("ODC-BY-1.0").id == "ODC-By-1.0"  # the voyage's spelling; SPDX writes ODC-By
    assert License("cc-by-4.0") == License("CC-BY-4.0")
    assert License("PSF-2.0").to_json() == {"id": "PSF-2.0", "url": "", "spdx": True}


def test_an_unknown_spdx_id_is_refused_naming_the_closest():
    with pytest.raises(VoyageError, match=r"'CC-BY-4\.1'\): not an SPDX id \(closest SPDX ids: CC-BY-4\.0"):
        License("CC-BY-4.1")
    with pytest.raises(VoyageError, match="empty id"):
        License("  ")


def test_a_licence_without_spdx_id_needs_the_url_of_its_terms():
    lic = License("NVIDIA  data agreement", url="https://example.org/terms")
    assert lic.id == "NVIDIA data agreement" and not lic.spdx
    assert lic.to_json() == {"id": "NVIDIA data agreement", "url": "https://example.org/terms", "spdx": False}
    assert License.from_json(lic.to_json()) == lic
    with pytest.raises(VoyageError, match="needs the url"):
        License("NVIDIA data agreement")


def test_unreadable_licences_read_back_as_noassertion():
    assert License.from_json(None) is NOASSERTION
    assert License.from_json({"id": ""}) is NOASSERTION
    # a hand-edited id that is no longer valid is kept as it says, never dropped
    assert License.from_json({"id": "CC-BY-4.1"}).id == "CC-BY-4.1"


def test_open_only_policy():
    policy = LicensePolicy.open_only()
    assert policy.allows(License("cc-by-sa-4.0")) and policy.allows(License(PUBLIC_DOMAIN, url="https://x"))
    assert not policy.allows(License("NVIDIA data agreement", url="https://x"))
    assert not policy.allows(NOASSERTION)
    assert "CC-BY-NC-4.0" not in OPEN_LICENSES
    custom = LicensePolicy(allow=("cc-by-4.0", License("NVIDIA data agreement", url="u")))
    assert custom.allows(License("CC-BY-4.0")) and custom.allows(License("NVIDIA data agreement", url="u"))
    with pytest.raises(VoyageError, match="not one string"):
        LicensePolicy(allow="MIT")
    with pytest.raises(VoyageError, match="licenses= takes a LicensePolicy"):
        Step("x", noop, Plain(), licenses="open")


@dataclass(frozen=True)
class Source:
    text: str = "a"
    license: License | None = None


@dataclass(frozen=True)
class Plain:
    text: str = "a"


@step_type(version="1", name="licence_test_noop")
def noop(config, ctx) -> None:
    """Nothing."""


def test_a_licence_field_makes_a_source_and_none_is_noassertion():
    assert license_fields(Source) == ("license",) and license_fields(Plain) == ()
    assert declared_license(Source(license=License("MIT"))) == License("MIT")
    assert declared_license(Source()) is NOASSERTION
    assert declared_license(Plain()) is None
    with pytest.raises(VoyageError, match=r"config.license: 'MIT' is not a License; write License\('MIT'\)"):
        declared_license(Source(license="MIT"))


def test_the_licence_is_identity_and_no_licence_leaves_old_digests_alone():
    """Correcting a licence re-addresses the source (it is data); the field's default (None)
    leaves the digest of a config that never named one unchanged."""
    a = build_dag([Step("s", noop, Source(license=License("MIT")))])["s"].digest
    b = build_dag([Step("s", noop, Source(license=License("Apache-2.0")))])["s"].digest
    c = build_dag([Step("s", noop, Source())])["s"].digest
    d = build_dag([Step("s", noop, Source(license=License("mit")))])["s"].digest
    assert len({a, b, c}) == 3 and a == d
    # the policy is not identity: it refuses, it never changes what a step makes
    e = build_dag([Step("s", noop, Source(license=License("MIT")), licenses=LicensePolicy.open_only())])["s"].digest
    assert e == a


# -- checked licence lists ---------------------------------------------------------


def test_policy_lists_are_checked_like_sources_licences():
    """A typo is refused naming the closest ids, in allow and in deny; a licence with no SPDX id
    is named as its source declares it (a License with its url), never as a bare string."""
    with pytest.raises(VoyageError, match=r"LicensePolicy\(allow=...\): 'Apache 2.0' is not an SPDX id "
                                          r"\(closest: Apache-2.0"):
        LicensePolicy(allow=("Apache 2.0", "MIT"))
    with pytest.raises(VoyageError, match=r"'MIT-2' is not an SPDX id \(closest: MIT-0"):
        LicensePolicy(allow=("MIT", "MIT-2"))
    with pytest.raises(VoyageError, match=r"LicensePolicy\(deny=...\): 'CC-BY-NC-4.1' is not an SPDX id "
                                          r"\(closest: CC-BY-NC-4.0"):
        LicensePolicy(deny=("CC-BY-NC-4.1",))
    with pytest.raises(VoyageError, match=r"License\('NVIDIA data agreement', url=...\)"):
        LicensePolicy(allow=("NVIDIA data agreement",))
    with pytest.raises(VoyageError, match="give `allow`"):
        LicensePolicy()
    with pytest.raises(VoyageError, match="not one"):
        LicensePolicy(deny=License("MIT"))
    assert LicensePolicy(allow=("mit", "noassertion", "Public  Domain")).allow == {"MIT", "NOASSERTION",
                                                                                   PUBLIC_DOMAIN}


def test_deny_refuses_what_allow_would_let_through():
    policy = LicensePolicy(deny=("CC-BY-NC-4.0", License("NVIDIA data agreement", url="https://x")))
    assert policy.allows(License("MIT")) and policy.allows(NOASSERTION)
    assert not policy.allows(License("cc-by-nc-4.0"))
    assert not policy.allows(License("nvidia  DATA agreement", url="https://y"))
    both = LicensePolicy(allow=OPEN_LICENSES, deny=("GPL-3.0",))  # deprecated: taken as GPL-3.0-only
    assert both.deny == {"GPL-3.0-only"} and not both.allows(License("GPL-3.0-only")) and both.allows(License("MIT"))
    assert both.describe() == "allows " + ", ".join(sorted(OPEN_LICENSES)) + "; denies GPL-3.0-only"


def test_deprecated_spdx_ids_take_their_current_form():
    """One licence, one spelling, one digest."""
    assert License("GPL-3.0").id == "GPL-3.0-only" and License("gpl-3.0+").id == "GPL-3.0-or-later"
    assert License("LGPL-2.1").id == "LGPL-2.1-only" and License("BSD-2-Clause-FreeBSD").id == "BSD-2-Clause"
    assert License("AGPL-3.0").id == "AGPL-3.0-only" and License("StandardML-NJ").id == "SMLNJ"
    assert License("eCos-2.0").id == "eCos-2.0"  # deprecated with no single id to replace it: kept
    assert License("GPL-3.0").spdx
    assert build_dag([Step("s", noop, Source(license=License("GPL-3.0")))])["s"].digest == \
        build_dag([Step("s", noop, Source(license=License("GPL-3.0-only")))])["s"].digest
    assert LicensePolicy(allow=("GPL-2.0+",)).allows(License("GPL-2.0-or-later"))


def test_names_that_are_not_spdx_ids_match_in_any_case():
    policy = LicensePolicy(allow=("public domain", License("Per-Source Licences", url="https://x")))
    assert policy.allows(License("Public Domain", url="https://www.gutenberg.org/ebooks/10"))
    assert policy.allows(License("per-source  licences", url="https://y"))
    assert not policy.allows(License("per-paper licences", url="https://y"))
    assert LicensePolicy.open_only().allows(License("PUBLIC DOMAIN", url="https://x"))
