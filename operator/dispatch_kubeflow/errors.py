"""The adapter's error family.

Callers branch on the class, people read the message: every message names what was refused and
why, in one line.
"""

from __future__ import annotations


class DispatchError(Exception):
    """Base of every error the adapter raises on purpose."""


class ErrInvalid(DispatchError):
    """The input breaks a rule: a settings document, a job spec, a changed (job, attempt)."""


class ErrUnsupported(DispatchError):
    """The request is well-formed but this adapter or cluster cannot carry it out."""


class ErrOutcomeUnknown(DispatchError):
    """A write may or may not have happened, and reading back could not tell which."""


class ErrNotFound(DispatchError):
    """Nothing of the named job exists."""
