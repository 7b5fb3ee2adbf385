# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ONE table of URI backends: every ``kms://`` and ``storage://`` backend with its whole rule.

A row (``Backend``) names its parameters in Constellation's order and says which of them are secret (never
shown in a repr, a str or an error), which are free text (any printable character: secrets, file paths;
every other parameter is a cloud identifier), which are base64 and which take one of a few values. The URI
parser, ``BackendURI``'s repr, the error messages, ``open_kms`` and the backup read the row; no other list of
parameters exists. The rows we ship are registered in ``backends.py``; adding a backend: docs/kms.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

KMS_SCHEME = "kms"
STORAGE_SCHEME = "storage"


@dataclass(frozen=True)
class Backend:
    """One backend: its name in ``<scheme>://<name>?...``, its parameters in Constellation's order (each one
    mandatory), a summary, how to open it (``open(BackendURI) -> KMS``; None: valid, but not available here)
    and the declarations the parser and the redaction read."""

    name: str
    params: Tuple[str, ...]
    summary: str
    open: Optional[Callable[[Any], Any]] = None
    # Values never shown: a repr or str of the parsed URI says <secret>, an error never quotes them.
    secret_params: Tuple[str, ...] = ()
    # Any printable text (secrets, file paths); every other parameter is an identifier, for which '&', '=',
    # '?', '#', '%' or spaces can only mean an injection attempt.
    free_text_params: Tuple[str, ...] = ()
    # URL-safe base64 with padding, written raw (its alphabet is query-safe).
    base64_params: Tuple[str, ...] = ()
    # (parameter, its allowed values) pairs.
    choices: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    scheme: str = KMS_SCHEME

    def __post_init__(self):
        object.__setattr__(self, "params", tuple(self.params))
        for field in ("secret_params", "free_text_params", "base64_params"):
            declared = tuple(getattr(self, field))
            object.__setattr__(self, field, declared)
            if set(declared) - set(self.params):
                raise ValueError("backend %s: %s names parameters it does not have" % (self.name, field))
        object.__setattr__(self, "choices", tuple((name, tuple(values)) for name, values in self.choices))
        if set(dict(self.choices)) - set(self.params) or set(self.base64_params) & set(self.free_text_params):
            raise ValueError("backend %s: choices or base64 parameters that it does not have or that are free text"
                             % self.name)
        if self.scheme not in TABLES:
            raise ValueError("backend %s: scheme %s is not one of %s" % (self.name, self.scheme, ", ".join(TABLES)))

    def is_secret(self, param: str) -> bool:
        return param in self.secret_params

    def allowed(self, param: str) -> Optional[Tuple[str, ...]]:
        return dict(self.choices).get(param)


# Backends by scheme, then by name; filled by register_backend only.
BACKENDS: Dict[str, Backend] = {}
STORAGE_BACKENDS: Dict[str, Backend] = {}
TABLES: Dict[str, Dict[str, Backend]] = {KMS_SCHEME: BACKENDS, STORAGE_SCHEME: STORAGE_BACKENDS}


def register_backend(backend: Backend) -> Backend:
    """Adds a backend, with its whole rule, to its scheme's table."""
    table = TABLES[backend.scheme]
    if backend.name in table and table[backend.name] != backend:
        raise ValueError("%s backend %s is already registered" % (backend.scheme, backend.name))
    table[backend.name] = backend
    return backend


def unregister_backend(name: str, scheme: str = KMS_SCHEME) -> None:
    """Removes a backend added with register_backend (tests)."""
    TABLES[scheme].pop(name, None)


def backend_of(scheme: str, name: str) -> Optional[Backend]:
    """The registered row of ``<scheme>://<name>``, or None."""
    return TABLES.get(scheme, {}).get(name)
