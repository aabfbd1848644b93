"""The project's error family.

Callers branch on the class, people read the message: every message names what was refused and
why, in one line. The four classes of the contract (``ErrInvalid``, ``ErrUnsupported``,
``ErrOutcomeUnknown``, ``ErrNotFound``) are aliases of the clearer names below; the subclasses
say more where a caller needs to tell cases apart (a preflight probe that failed, a request the
apiserver forbade, an apiserver that could not answer now).
"""

from __future__ import annotations


class DispatchError(Exception):
    """Base of every error the project raises on purpose."""


class InvalidError(DispatchError):
    """The input breaks a rule: a settings document, a job spec, a changed (job, attempt)."""


class UnsupportedError(DispatchError):
    """The request is well-formed but this adapter or cluster cannot carry it out."""


class OutcomeUnknownError(DispatchError):
    """A write may or may not have happened, and reading back could not tell which."""


class NotFoundError(DispatchError):
    """Nothing of the named job exists."""


class RuntimeUnsupportedError(UnsupportedError):
    """The job's runtime cannot carry it: not the adapter's, missing, or against the rules."""


class ProbeError(UnsupportedError):
    """The preflight probe found the Trainer API missing, too old, or not usable."""


class ForbiddenError(UnsupportedError):
    """The apiserver refused a request for lack of permission: a configuration problem.

    ``verb`` and ``resource`` name what is missing, so the fix (an RBAC rule) is plain.
    """

    def __init__(self, message: str, *, verb: str = "", resource: str = "") -> None:
        super().__init__(message)
        self.verb = verb
        self.resource = resource


class ApiMissingError(UnsupportedError):
    """The apiserver does not serve the API a request needs (its CRD is not installed)."""


class RefusedError(InvalidError):
    """The apiserver refused an object as invalid (HTTP 400 or 422)."""


class UnavailableError(OutcomeUnknownError):
    """The apiserver could not be reached or answered with a transient error (5xx, 429, timeout).

    Sending the request again later may succeed; it is never a verdict on a job.
    """


ErrInvalid = InvalidError
ErrUnsupported = UnsupportedError
ErrOutcomeUnknown = OutcomeUnknownError
ErrNotFound = NotFoundError
