"""The one mapping of API and transport failures to the error family."""

from __future__ import annotations

import json

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.errors import (
    ApiMissingError,
    DispatchError,
    ErrInvalid,
    ErrOutcomeUnknown,
    ErrUnsupported,
    ForbiddenError,
    RefusedError,
    UnavailableError,
)
from dispatch_kubeflow.kube.apierrors import (
    REQUEST_ERRORS,
    api_message,
    describe,
    is_conflict,
    is_forbidden,
    is_gone,
    is_invalid,
    is_not_found,
    is_replaced,
    is_transient,
    is_transport,
    status_of,
    to_dispatch_error,
)


def api_error(status: int, message: str | None = "the apiserver's words") -> ApiException:
    error = ApiException(status=status, reason="Reason Phrase")
    if message is not None:
        error.body = json.dumps({"kind": "Status", "message": message}).encode()
    return error


def test_status_predicates() -> None:
    assert status_of(api_error(404)) == 404
    assert status_of(TimeoutError()) is None
    assert is_not_found(api_error(404))
    assert is_conflict(api_error(409))
    assert is_gone(api_error(410))
    assert is_forbidden(api_error(403))
    assert is_invalid(api_error(422))
    assert not is_invalid(api_error(400))
    assert not is_not_found(aiohttp.ClientConnectionError())


def invalid_on(*fields: str) -> ApiException:
    error = ApiException(status=422, reason="Unprocessable Entity")
    causes = [{"reason": "FieldValueInvalid", "field": field} for field in fields]
    error.body = json.dumps({"kind": "Status", "details": {"causes": causes}}).encode()
    return error


def test_only_a_refusal_on_the_uid_says_the_object_was_replaced() -> None:
    assert is_replaced(invalid_on("metadata.uid"))
    assert is_replaced(invalid_on("spec.suspend", "metadata.uid"))
    assert not is_replaced(invalid_on("metadata.annotations"))
    assert not is_replaced(api_error(422))  # no causes at all
    not_found = api_error(404)
    not_found.body = invalid_on("metadata.uid").body
    assert not is_replaced(not_found)
    garbled = invalid_on("metadata.uid")
    garbled.body = b"<html>"
    assert not is_replaced(garbled)
    assert not is_replaced(TimeoutError())


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (api_error(500), True),
        (api_error(503), True),
        (api_error(429), True),
        (aiohttp.ClientConnectionError(), True),
        (TimeoutError(), True),
        (ConnectionRefusedError(), True),
        (api_error(404), False),
        (api_error(409), False),
        (api_error(422), False),
    ],
)
def test_transient_failures_are_transport_5xx_and_429(
    error: BaseException, transient: bool
) -> None:
    assert is_transient(error) is transient
    assert isinstance(error, REQUEST_ERRORS)


def test_transport_failures_are_not_http_answers() -> None:
    assert is_transport(aiohttp.ServerDisconnectedError())
    assert is_transport(OSError())
    assert not is_transport(api_error(500))


def test_the_apiserver_message_is_read_from_its_status_body() -> None:
    assert api_message(api_error(422, "spec.x: Invalid value")) == "spec.x: Invalid value"
    assert api_message(api_error(500, message=None)) == "Reason Phrase"
    unreadable = ApiException(status=500, reason="Internal")
    unreadable.body = b"<html>"
    assert api_message(unreadable) == "Internal"


def test_describe_gives_one_line_for_any_failure() -> None:
    assert describe(api_error(404, "not here")) == "HTTP 404: not here"
    assert describe(TimeoutError()) == "the request timed out"
    assert describe(aiohttp.ClientConnectionError("refused")) == "ClientConnectionError: refused"


@pytest.mark.parametrize(
    ("error", "kind", "contract", "message"),
    [
        (api_error(403), ForbiddenError, ErrUnsupported, "reading x: forbidden: the apiserver's"),
        (api_error(404), ApiMissingError, ErrUnsupported, "reading x: not found, is the API"),
        (api_error(400), RefusedError, ErrInvalid, "reading x: refused: the apiserver's words"),
        (api_error(422), RefusedError, ErrInvalid, "reading x: refused: the apiserver's words"),
        (api_error(500), UnavailableError, ErrOutcomeUnknown, "reading x: the apiserver answered"),
        (api_error(429), UnavailableError, ErrOutcomeUnknown, "reading x: the apiserver answered"),
        (TimeoutError(), UnavailableError, ErrOutcomeUnknown, "reading x: the request timed out"),
        (
            aiohttp.ClientConnectionError("refused"),
            UnavailableError,
            ErrOutcomeUnknown,
            "reading x: ClientConnectionError: refused",
        ),
    ],
)
def test_each_failure_maps_to_the_error_that_says_what_it_means(
    error: BaseException,
    kind: type[DispatchError],
    contract: type[DispatchError],
    message: str,
) -> None:
    mapped = to_dispatch_error("reading x", error)
    assert type(mapped) is kind
    assert isinstance(mapped, contract)  # the contract's four classes still catch it
    assert str(mapped).startswith(message)


def test_a_forbidden_request_names_the_verb_and_resource_it_needed() -> None:
    mapped = to_dispatch_error("listing pods", api_error(403), verb="list", resource="pods")
    assert isinstance(mapped, ForbiddenError)
    assert (mapped.verb, mapped.resource) == ("list", "pods")
