"""The one mapping from API and transport failures to the project's error family.

kubernetes_asyncio raises ``ApiException`` for an HTTP error and lets aiohttp's and asyncio's
exceptions through for a transport failure. Callers should not branch on status codes or on
exception modules: they ask the predicates here (``is_not_found``, ``is_transient``, ...) or
turn a failure into a typed error with ``to_dispatch_error``, which keeps the apiserver's own
message.
"""

from __future__ import annotations

import json

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.errors import (
    ApiMissingError,
    DispatchError,
    ForbiddenError,
    RefusedError,
    UnavailableError,
)

# Failures of the connection itself: the request may or may not have reached the apiserver.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError, OSError)
# Every way a request can fail: an HTTP error answer, or the transport.
REQUEST_ERRORS: tuple[type[BaseException], ...] = (ApiException, *TRANSPORT_ERRORS)

HTTP_BAD_REQUEST = 400
HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_GONE = 410
HTTP_UNPROCESSABLE = 422
HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an API error, None for anything else."""
    return error.status if isinstance(error, ApiException) else None


def is_not_found(error: BaseException) -> bool:
    return status_of(error) == HTTP_NOT_FOUND


def is_conflict(error: BaseException) -> bool:
    return status_of(error) == HTTP_CONFLICT


def is_gone(error: BaseException) -> bool:
    """HTTP 410: a resourceVersion or continue token too old to serve; list again."""
    return status_of(error) == HTTP_GONE


def is_invalid(error: BaseException) -> bool:
    """HTTP 422: the apiserver refused an object as invalid (its schema or validation rules)."""
    return status_of(error) == HTTP_UNPROCESSABLE


def is_replaced(error: BaseException) -> bool:
    """HTTP 422 on ``metadata.uid``: a write carrying an object's uid reached another object.

    The object named was deleted and created again under the same name; the write was meant for
    the first one and the apiserver changed nothing.
    """
    if not is_invalid(error) or not isinstance(error, ApiException):
        return False
    try:
        causes = json.loads(error.body or b"").get("details", {}).get("causes") or []
    except (TypeError, ValueError, AttributeError):
        return False
    return any(isinstance(c, dict) and c.get("field") == "metadata.uid" for c in causes)


def is_forbidden(error: BaseException) -> bool:
    return status_of(error) == HTTP_FORBIDDEN


def is_transport(error: BaseException) -> bool:
    return isinstance(error, TRANSPORT_ERRORS)


def is_transient(error: BaseException) -> bool:
    """A failure that sending the same request later may not repeat: transport, 5xx, 429."""
    if is_transport(error):
        return True
    status = status_of(error)
    return status is not None and (status >= HTTP_SERVER_ERROR or status == HTTP_TOO_MANY_REQUESTS)


def api_message(error: ApiException) -> str:
    """The apiserver's own message (from its Status body), else the HTTP reason phrase."""
    try:
        return str(json.loads(error.body or b"").get("message") or error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(error.reason)


def describe(error: BaseException) -> str:
    """One line for a log or a status message, for any failure of a request."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status}: {api_message(error)}"
    if isinstance(error, TimeoutError):
        return "the request timed out"
    return f"{type(error).__name__}: {error}"


def to_dispatch_error(
    what: str, error: BaseException, *, verb: str = "", resource: str = ""
) -> DispatchError:
    """``error``, raised while doing ``what``, as the error family member that says what it means.

    ``verb`` and ``resource`` name the request, so a 403 tells which RBAC rule is missing.
    """
    if is_transport(error):
        return UnavailableError(f"{what}: {describe(error)}")
    if not isinstance(error, ApiException):
        return UnavailableError(f"{what}: {describe(error)}")
    message = api_message(error)
    if error.status == HTTP_FORBIDDEN:
        return ForbiddenError(f"{what}: forbidden: {message}", verb=verb, resource=resource)
    if error.status == HTTP_NOT_FOUND:
        return ApiMissingError(f"{what}: not found, is the API installed? {message}")
    if error.status in (HTTP_BAD_REQUEST, HTTP_UNPROCESSABLE):
        return RefusedError(f"{what}: refused: {message}")
    return UnavailableError(f"{what}: the apiserver answered {error.status}: {message}")
