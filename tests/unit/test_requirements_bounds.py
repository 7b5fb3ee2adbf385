# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""requirements.txt's lower bounds are true of each other: where a listed package is installed here at its own
lower bound (pyproject.toml pins it there), what that version requires of another listed package is no more than
requirements.txt's bound for it (tpm2-pytss 3.0.0 needs cryptography 47.0 or later, so the file cannot say 38)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _bounds():
    bounds = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            lower = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
            assert lower, "requirements.txt: %s has no lower bound" % line
            bounds[requirement.name.lower()] = lower[0]
    return bounds


def test_each_package_at_its_lower_bound_needs_no_more_than_the_bounds_of_the_others():
    bounds, checked, wrong = _bounds(), [], []
    for name, lower in sorted(bounds.items()):
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        if installed != lower:
            continue  # its newer versions may need more than its lowest did: not evidence about the bound
        for text in metadata.requires(name) or ():
            needed = Requirement(text)
            if needed.marker and not needed.marker.evaluate({"extra": ""}):
                continue
            other = needed.name.lower()
            if other not in bounds:
                continue
            checked.append("%s %s -> %s" % (name, lower, needed))
            if not needed.specifier.contains(bounds[other], prereleases=True):
                wrong.append("requirements.txt says %s>=%s, but %s %s requires %s"
                             % (other, bounds[other], name, lower, needed))
    assert not wrong, "\n".join(wrong)
    assert any(line.startswith("tpm2-pytss") for line in checked), checked  # the check saw the known case
