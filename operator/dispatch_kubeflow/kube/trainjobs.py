"""Writes to one TrainJob that must reach that TrainJob and no other of its name.

A job id used again makes a new TrainJob under the old one's name; a write meant for the old one
(from a cache, or from a read a moment ago) must not land on the new one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from dispatch_kubeflow.constants import MERGE_PATCH, TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, is_not_found, is_replaced
from dispatch_kubeflow.kube.objects import name_of, uid_of


async def annotate_trainjob(
    objects: client.CustomObjectsApi,
    namespace: str,
    trainjob: Mapping[str, Any],
    annotations: Mapping[str, str],
    *,
    request_timeout: float | None = None,
) -> bool:
    """Set ``annotations`` on ``trainjob`` in one merge patch; False when it is gone.

    The patch carries the TrainJob's uid. Gone is deleted (HTTP 404) or deleted and created again
    under its name: the apiserver refuses a uid that is not the object's (HTTP 422 on
    ``metadata.uid``) and changes nothing. Any other failure raises.
    """
    metadata: dict[str, Any] = {"annotations": dict(annotations)}
    if uid := uid_of(trainjob):
        metadata["uid"] = uid
    options: dict[str, Any] = {"_content_type": MERGE_PATCH}
    if request_timeout is not None:
        options["_request_timeout"] = request_timeout
    # The typed stub omits _content_type; without it a dict body goes out as a JSON patch.
    patch: Callable[..., Awaitable[Any]] = objects.patch_namespaced_custom_object
    try:
        await patch(
            TRAINER_GROUP,
            TRAINER_VERSION,
            namespace,
            TRAINJOBS,
            name_of(trainjob),
            {"metadata": metadata},
            **options,
        )
    except REQUEST_ERRORS as error:
        if is_not_found(error) or is_replaced(error):
            return False
        raise
    return True
