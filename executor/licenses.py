"""Licences as data: `License`, the licence of a source, and `LicensePolicy`, which licences may
reach a step.

A licence is an SPDX id where one exists (`License("CC-BY-4.0")`, checked against the SPDX list
that `packaging` ships and written in its canonical case; a deprecated id in its current form,
`GPL-3.0` as `GPL-3.0-only`, so one licence has one spelling and one digest), else a short name with the URL of its
terms (`License("NVIDIA data agreement", url="https://...")`). An id that looks like no SPDX id and
has no URL is refused, naming the closest SPDX ids, so a typo (`CC-BY-4.1`) is never taken for a
licence nobody can look up.

A config field typed `License` (or `License | None`) makes its step a *source*: the licence enters
there (ingest, a pinned tokenizer) and flows to every step downstream (executor.lineage). A source
whose field is None declared no licence: `NOASSERTION` (SPDX's word for it), which no policy allows
unless it names it.

A licence is part of the source's identity (it is data, in the digest like any config field):
correcting it re-addresses the source and everything built from it, so no output ever carries a
licence other than the one it was made under.
"""

from __future__ import annotations

import difflib
import functools
import typing
from dataclasses import dataclass
from typing import Any, Iterable

from executor.errors import VoyageError


# Deprecated SPDX ids whose replacement is not the `-only`/`-or-later` form (SPDX's own notes).
_REPLACED = {"BSD-2-Clause-FreeBSD": "BSD-2-Clause", "BSD-2-Clause-NetBSD": "BSD-2-Clause",
             "StandardML-NJ": "SMLNJ", "bzip2-1.0.5": "bzip2-1.0.6", "Nunit": "zlib-acknowledgement"}


@functools.lru_cache(maxsize=1)
def _spdx() -> dict[str, str]:
    """lower-case SPDX id -> its canonical spelling (licences and the exception-free ids); a
    deprecated id -> the id that replaced it, where SPDX names one (GPL-3.0 -> GPL-3.0-only,
    GPL-2.0+ -> GPL-2.0-or-later), else itself."""
    # The SPDX list as `packaging` (>= 24.2, PEP 639) ships it, one release of the list per
    # release of packaging; its public API only validates whole expressions, so the table is read.
    from packaging.licenses._spdx import LICENSES

    table = {key: value["id"] for key, value in LICENSES.items()}
    for key, value in LICENSES.items():
        if not value.get("deprecated"):
            continue
        old = value["id"]
        new = _REPLACED.get(old) or (old[:-1] + "-or-later" if old.endswith("+") else old + "-only")
        if new.lower() in LICENSES and not LICENSES[new.lower()].get("deprecated"):
            table[key] = LICENSES[new.lower()]["id"]
    return table


def spdx_id(text: str) -> str | None:
    """The canonical SPDX id for `text` (any case), or None if it is not one."""
    return _spdx().get(text.strip().lower())


@dataclass(frozen=True)
class License:
    """The licence of a source: an SPDX id, or a short name with the URL of its terms."""

    id: str
    url: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise VoyageError(f"License: empty id {self.id!r}; give an SPDX id or a short name with a url")
        canonical = spdx_id(self.id)
        if canonical is not None:
            object.__setattr__(self, "id", canonical)  # one spelling, one digest
        elif self.id == NOASSERTION_ID:
            pass
        elif not self.url:
            close = difflib.get_close_matches(self.id.lower(), list(_spdx()), n=3, cutoff=0.75)
            hint = f" (closest SPDX ids: {', '.join(_spdx()[c] for c in close)})" if close else ""
            raise VoyageError(f"License({self.id!r}): not an SPDX id{hint}; a licence without one needs the url "
                              "of its terms: License(name, url=...)")
        else:
            object.__setattr__(self, "id", " ".join(self.id.split()))

    @property
    def spdx(self) -> bool:
        """Whether `id` is an SPDX licence id."""
        return spdx_id(self.id) is not None

    def to_json(self) -> dict[str, Any]:
        """How a licence is written in manifests and records: {"id", "url", "spdx"}."""
        return {"id": self.id, "url": self.url, "spdx": self.spdx}

    @classmethod
    def from_json(cls, data: Any) -> "License":
        """A licence read back from a manifest or record (NOASSERTION for anything unreadable)."""
        if isinstance(data, dict) and isinstance(data.get("id"), str) and data["id"].strip():
            try:
                return cls(data["id"], str(data.get("url") or ""))
            except VoyageError:  # an id written by hand that is no longer valid: keep what it says
                return _unchecked(data["id"], str(data.get("url") or ""))
        return NOASSERTION

    def describe(self) -> str:
        return self.id if self.spdx or not self.url else f"{self.id} <{self.url}>"

    def __str__(self) -> str:
        return self.id


def _unchecked(id: str, url: str) -> License:
    lic = object.__new__(License)
    object.__setattr__(lic, "id", id)
    object.__setattr__(lic, "url", url)
    return lic


NOASSERTION_ID = "NOASSERTION"
NOASSERTION = License(NOASSERTION_ID)  # a source that declared no licence
PUBLIC_DOMAIN = "public domain"  # no SPDX id exists for works in the public domain

# Licences under which anyone may use, share and build on the data, the model included: public
# domain and its dedications, permissive and copyleft open-source licences, and the open-data
# licences (attribution and share-alike allow release; what they ask is attribution, which the
# model card gives). Not here: non-commercial, no-derivatives, bespoke agreements, and any
# "per-item" licence nobody checked.
OPEN_LICENSES = frozenset({
    PUBLIC_DOMAIN, "CC0-1.0", "PDDL-1.0", "Unlicense", "0BSD",
    "MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "ISC", "Zlib", "PSF-2.0", "Python-2.0",
    "CC-BY-3.0", "CC-BY-4.0", "CC-BY-SA-3.0", "CC-BY-SA-4.0", "ODC-By-1.0", "ODbL-1.0",
    "CDLA-Permissive-1.0", "CDLA-Permissive-2.0", "CDLA-Sharing-1.0",
    "MPL-2.0", "LGPL-2.1-only", "LGPL-2.1-or-later", "LGPL-3.0-only", "LGPL-3.0-or-later",
    "GPL-2.0-only", "GPL-2.0-or-later", "GPL-3.0-only", "GPL-3.0-or-later", "GFDL-1.3-only", "GFDL-1.3-or-later",
})


@dataclass(frozen=True)
class LicensePolicy:
    """Which licences may reach a step (or every step of a voyage): those `allow` names (all when it
    is None) less those `deny` names. Entries are checked as sources' licences are: an SPDX id in
    any case (a deprecated one taken in its current form), NOASSERTION, "public domain", or a
    `License(name, url=...)` as the source declares it; anything else is refused naming the
    closest ids, so a typo never makes a policy that matches nothing. Names that are not SPDX ids
    match in any case and spacing. Checked when the plan is made, from the DAG alone: a voyage
    where a refused licence would reach the step is stopped before anything runs."""

    allow: frozenset[str] | None = None  # None: any licence that `deny` does not name
    name: str = ""  # how the plan and errors call it ("open licences only")
    deny: frozenset[str] = frozenset()  # refused even when `allow` names them

    def __post_init__(self) -> None:
        for name in ("allow", "deny"):
            given = getattr(self, name)
            if given is None:
                continue
            if isinstance(given, (str, License)):
                raise VoyageError(f"LicensePolicy({name}={given!r}): give a collection of licence ids, not one string or licence")
            object.__setattr__(self, name, frozenset(policy_id(a, f"LicensePolicy({name}=...)") for a in given))
        if self.allow is None and not self.deny:
            raise VoyageError("LicensePolicy: give `allow` (the licences that may reach the step) or `deny` (those "
                              "that may not)")
        # what a licence is matched by: SPDX ids are canonical already; other names in any case
        object.__setattr__(self, "_allow_keys", None if self.allow is None else frozenset(map(_key, self.allow)))
        object.__setattr__(self, "_deny_keys", frozenset(map(_key, self.deny)))

    @classmethod
    def open_only(cls, also: Iterable[str] = ()) -> "LicensePolicy":
        """Open licences only (OPEN_LICENSES), plus the ids in `also`: for a checkpoint meant for
        public release."""
        extra = tuple(also)
        name = "open licences only" + (f" (and {', '.join(extra)})" if extra else "")
        return cls(OPEN_LICENSES | frozenset(extra), name=name)

    def allows(self, license: "License | str") -> bool:
        """Whether this licence (or licence id) may reach the step."""
        key = _key(license.id if isinstance(license, License) else license)
        allowed = self._allow_keys is None or key in self._allow_keys  # type: ignore[attr-defined]
        return allowed and key not in self._deny_keys  # type: ignore[attr-defined]

    def describe(self) -> str:
        if self.name:
            return self.name
        parts = [] if self.allow is None else ["allows " + ", ".join(sorted(self.allow))]
        return "; ".join(parts + (["denies " + ", ".join(sorted(self.deny))] if self.deny else []))


def _key(text: str) -> str:
    """What two spellings of one licence share: the canonical SPDX id, else the name in lower case
    with its spaces collapsed ("Public  Domain" and "public domain" are one licence)."""
    return spdx_id(text) or " ".join(str(text).split()).casefold()


_NAMES = {NOASSERTION_ID.casefold(): NOASSERTION_ID, PUBLIC_DOMAIN: PUBLIC_DOMAIN}  # non-SPDX words taken bare


def policy_id(entry: "License | str", where: str) -> str:
    """A policy entry as the id it matches: an SPDX id (canonical), NOASSERTION, "public domain",
    or the id of a `License` (a name with the URL of its terms, checked when it was made). Any
    other string is refused, naming the closest ids."""
    if isinstance(entry, License):
        return entry.id
    if not isinstance(entry, str) or not entry.strip():
        raise VoyageError(f"{where}: {entry!r} is not a licence id")
    found = spdx_id(entry) or _NAMES.get(" ".join(entry.split()).casefold())
    if found:
        return found
    text = "-".join(entry.split()).lower()  # "Apache 2.0" reads as "apache-2.0"
    choices = list(_spdx()) + list(_NAMES)
    close = difflib.get_close_matches(text, choices, n=3, cutoff=0.75)
    names = [_spdx().get(c) or _NAMES[c] for c in close]
    hint = f" (closest: {', '.join(dict.fromkeys(names))})" if names else ""
    raise VoyageError(f"{where}: {entry!r} is not an SPDX id{hint}; a licence without one is named as its "
                      f"source declares it: License({entry!r}, url=...)")


# -- where licences are declared -------------------------------------------------------------

_LICENSE_FIELDS: dict[type, tuple[str, ...]] = {}


def license_fields(cls: type) -> tuple[str, ...]:
    """The fields of a config dataclass declared `License` or `License | None` (once per class)."""
    found = _LICENSE_FIELDS.get(cls)
    if found is None:
        import dataclasses

        found = ()
        if dataclasses.is_dataclass(cls):
            try:
                hints = typing.get_type_hints(cls)
            except Exception:  # an unresolvable annotation elsewhere in the class: look at the raw text
                hints = {f.name: f.type for f in dataclasses.fields(cls)}
            found = tuple(f.name for f in dataclasses.fields(cls) if _is_license_type(hints.get(f.name)))
        _LICENSE_FIELDS[cls] = found
    return found


_LICENSE_TEXTS = frozenset({"License", "License|None", "None|License", "Optional[License]"})


def _is_license_type(hint: Any) -> bool:
    if hint is License:
        return True
    if isinstance(hint, str):  # an annotation get_type_hints could not resolve
        return "".join(hint.split()) in _LICENSE_TEXTS
    args = typing.get_args(hint)
    return bool(args) and License in args and all(a in (License, type(None)) for a in args)


def declared_license(config: Any) -> License | None:
    """The licence a step's config declares (NOASSERTION for a declared field left None), or None
    if its config has no licence field (the step is no source)."""
    names = license_fields(type(config))
    if not names:
        return None
    found = None
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, License):
            found = found or value
        elif value is not None:  # a plain string would be identity without being a licence anyone checked
            raise VoyageError(f"config.{name}: {value!r} is not a License; write License({str(value)!r}) for an "
                              "SPDX id, or License(name, url=...)")
    return found or NOASSERTION


def licenses_json(sources: dict[str, License]) -> dict[str, dict[str, Any]]:
    """`{source: licence}` as manifests and records write it, sorted by source."""
    return {name: sources[name].to_json() for name in sorted(sources)}


def from_json_map(data: Any) -> dict[str, License]:
    """The inverse of `licenses_json` (an absent or unreadable map reads as empty)."""
    if not isinstance(data, dict):
        return {}
    return {str(k): License.from_json(v) for k, v in data.items()}


__all__ = ["License", "LicensePolicy", "NOASSERTION", "OPEN_LICENSES", "PUBLIC_DOMAIN", "declared_license",
           "from_json_map", "license_fields", "licenses_json", "spdx_id"]
