# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The project's own exceptions. The Core raises them; adapters (modules, plugins,
servers) turn them into a clear message (``fail_json(msg=str(err))``), never a traceback."""

from __future__ import annotations


class ConstellationError(Exception):
    """Base class of every error the Core raises on purpose.

    ``reason``: an optional machine-readable code (one of the ``REASON_*`` constants) that travels
    with the error over the RPC (``END error {"kind", "message", "reason"}``), so callers decide
    by kind and reason, never by matching message text."""

    reason = None

    def with_reason(self, reason: str) -> "ConstellationError":
        self.reason = reason
        return self


# Machine-readable reasons (ConstellationError.reason).
REASON_NOT_WAITING_FOR_RECOVERY = "not_waiting_for_recovery"
REASON_INIT_PROOF = "init_proof"  # activation refused: a missing or wrong proof of the init secret
REASON_EVICTED = "evicted"  # the peer failed re-attestation and was evicted (docs/agent.md)
REASON_UNVERIFIED = "unverified"  # the peer could not be re-attested for a while: no new secret (docs/agent.md)
REASON_RATE_LIMITED = "rate_limited"  # too many requests of this kind (EnrollAK): try again later
REASON_NOT_ADMITTED = "not_admitted"  # a join refused: the admin did not admit the node's EK (core/admissions.py)

# How much of a wrong value an InputError shows.
MAX_GOT = 200


class InputError(ConstellationError, ValueError):
    """Bad input: names the field and what was expected."""

    def __init__(self, field: str, expected: str, got: object = None):
        self.field = field
        self.expected = expected
        self.got = got
        msg = "%s: expected %s" % (field, expected)
        if got is not None:
            try:
                shown = repr(got)
            except RecursionError:
                shown = "a deeply nested %s" % type(got).__name__
            if len(shown) > MAX_GOT:  # untrusted input may be a megabyte long: name it, do not copy it
                shown = shown[:MAX_GOT] + "... (%d characters)" % len(shown)
            msg += ", got %s" % shown
        super().__init__(msg)


class AttestationError(ConstellationError):
    """An attestation document, quote or certificate was refused."""


class MissingDependency(ConstellationError):
    """A Python package is not installed for the Python that runs this code (the controller's, or a node agent's):
    a fault of this machine, never a verdict on a peer (not an AttestationError). The message names the package,
    that Python and the fix; ``package`` is the package's name."""

    def __init__(self, package: str, needed_for: str, import_error: object = None):
        import sys

        self.package = package
        cause = "; the import failed with: %s" % import_error if import_error else ""
        super().__init__("the Python package %s is not installed for %s, which needs it for %s: install it there "
                         "(requirements.txt lists it)%s" % (package, sys.executable or "this Python", needed_for, cause))


class PeerUnreachable(ConstellationError):
    """No verdict on the peer: the connection or the aTLS handshake failed, timed out, was reset or
    ended before the peer's attestation arrived (or its validation could not finish in time). It is
    never a failed attestation (AttestationError): re-attestation counts it as an unreachable round
    (core/eviction/peer_trust.py), the connection plugin reports the host unreachable with the reason."""


class RateLimited(ConstellationError):
    """Too many requests of one kind, from this source or from all (rpc/rate_limit.py ``RateLimit``):
    refused before any work; the caller may try again after a while."""

    reason = REASON_RATE_LIMITED


class AccessDenied(ConstellationError):
    """The caller may not use this method (not authenticated as admin, not a VPN peer, no proof of
    the init secret, an evicted peer). ``rpc.server.AccessDenied`` is this class."""


class StateError(ConstellationError):
    """An operation is not allowed in the current state (e.g. a second activation)."""


class ExternalCommandError(ConstellationError):
    """A program we run (wg, wireguard-go, kubeadm, swtpm_setup) failed."""

    def __init__(self, argv, rc: int, stderr: str):
        self.argv = list(argv)
        self.rc = rc
        self.stderr = stderr
        super().__init__("%s exited with %d: %s" % (" ".join(self.argv[:3]), rc, stderr.strip()[-500:]))


class ConnectionLost(ConstellationError):
    """The peer went away in the middle of an exchange (the transports raise a subclass of it)."""


class StateDiskError(ConstellationError):
    """The encrypted state disk (disk/state_disk.py) cannot be formatted, opened or mounted as expected:
    the message names the device and what was expected (its LUKS2 UUID, the key, a free device)."""
