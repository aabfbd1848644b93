"""The informer's relist after 410, its resourceVersions and its paging, on canned answers.

A real kube-apiserver cannot be made, on demand, to delete an object exactly while a watch is
down and then answer 410, so the list/watch calls here are canned responses (the integration
tests cover the same paths against the real server, where the timing is not controllable).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dispatch_kubeflow.constants import KIND_TRAINJOB
from dispatch_kubeflow.kube.informer import Change, Informer, Synced

QueueItem = Change | Synced


class Content:
    def __init__(self, lines: list[dict[str, Any]]) -> None:
        self._lines = [json.dumps(line).encode() + b"\n" for line in lines]

    async def readline(self) -> bytes:
        return self._lines.pop(0) if self._lines else b""


class Response:
    def __init__(self, status: int, body: Any = None, lines: list[dict[str, Any]] | None = None):
        self.status = status
        self.reason = "canned"
        self._body = json.dumps(body).encode()
        self.content = Content(lines or [])

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {}}


def listing(rv: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}, "items": list(items)}


class Script:
    """Answers list and watch calls in order; records the arguments of each."""

    def __init__(self, *responses: Response) -> None:
        self._responses = list(responses)
        self.calls: list[dict[str, Any]] = []
        self.exhausted = asyncio.Event()

    async def __call__(self, **kwargs: Any) -> Response:
        self.calls.append(kwargs)
        if not self._responses:
            self.exhausted.set()
            await asyncio.Event().wait()
        return self._responses.pop(0)


async def run_until_exhausted(informer: Informer, script: Script) -> None:
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(script.exhausted.wait(), 5)
    finally:
        task.cancel()


async def test_relist_after_410_synthesises_deletions_and_resumes_from_the_new_version() -> None:
    seen: list[QueueItem] = []

    async def emit(item: QueueItem) -> None:
        seen.append(item)

    script = Script(
        Response(200, listing("10", obj("a", "5"), obj("b", "6"))),
        # The watch resumes from the list's version, sees a change, then is cut off.
        Response(200, lines=[{"type": "MODIFIED", "object": obj("a", "11")}]),
        # Resumed from 11: the version was compacted away meanwhile.
        Response(200, lines=[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]),
        # The relist: b was deleted while nothing watched, c is new, a is unchanged.
        Response(200, listing("20", obj("a", "11"), obj("c", "15"))),
        Response(
            200, lines=[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "25"}}}]
        ),
    )
    informer = Informer(KIND_TRAINJOB, script, emit)
    await run_until_exhausted(informer, script)

    changes = [(i.type, i.obj["metadata"]["name"]) for i in seen if isinstance(i, Change)]
    assert changes == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
        ("ADDED", "c"),
    ]
    assert [i.kind for i in seen if isinstance(i, Synced)] == [KIND_TRAINJOB, KIND_TRAINJOB]
    watches = [c for c in script.calls if c.get("watch")]
    assert [c["resource_version"] for c in watches] == ["10", "11", "20", "25"]
    assert all(c["allow_watch_bookmarks"] for c in watches)
    assert set(informer.cache) == {"a", "c"}
    assert informer.relists == 2


async def test_a_watch_is_never_started_without_a_resource_version() -> None:
    async def emit(item: QueueItem) -> None:
        pass

    script = Script(
        Response(200, {"metadata": {}, "items": []}),  # no resourceVersion: not watchable
        Response(500, {"message": "etcd unavailable"}),
        Response(200, listing("7")),
        Response(200, lines=[]),
    )
    informer = Informer(KIND_TRAINJOB, script, emit)
    await run_until_exhausted(informer, script)
    watches = [c for c in script.calls if c.get("watch")]
    assert watches
    assert all(c["resource_version"] == "7" for c in watches)


async def test_list_pages_are_followed_with_the_continue_token() -> None:
    async def emit(item: QueueItem) -> None:
        pass

    first = {"metadata": {"continue": "tok"}, "items": [obj("a", "1")]}
    script = Script(Response(200, first), Response(200, listing("9", obj("b", "2"))))
    informer = Informer(KIND_TRAINJOB, script, emit)
    await run_until_exhausted(informer, script)
    assert script.calls[1]["_continue"] == "tok"
    assert set(informer.cache) == {"a", "b"}


def owned(name: str, rv: str, owner: str | None) -> dict[str, Any]:
    labels = {"owner": owner} if owner else {}
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels}, "spec": {}}


async def test_the_index_matches_the_cache_after_every_change_and_relist() -> None:
    """Each emitted change finds the index as a scan of the cache would: through a label
    changed, an object deleted, a label removed and a relist that drops and adds objects."""

    def owner(item: Any) -> str | None:
        value = item["metadata"].get("labels", {}).get("owner")
        return str(value) if value is not None else None

    checked: list[dict[str, set[str]]] = []

    async def emit(item: QueueItem) -> None:
        scanned: dict[str, set[str]] = {}
        for cached in informer.cache.values():
            if (value := owner(cached)) is not None:
                scanned.setdefault(value, set()).add(cached["metadata"]["name"])
        for value in {"x", "y", "z", *scanned}:
            names = {found["metadata"]["name"] for found in informer.indexed(value)}
            assert names == scanned.get(value, set()), (value, item)
        checked.append(scanned)

    script = Script(
        Response(
            200, listing("10", owned("a", "1", "x"), owned("b", "2", "x"), owned("c", "3", "y"))
        ),
        Response(
            200,
            lines=[
                {"type": "MODIFIED", "object": owned("a", "11", "y")},
                {"type": "DELETED", "object": owned("b", "12", "x")},
                {"type": "MODIFIED", "object": owned("c", "13", None)},
            ],
        ),
        Response(200, lines=[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]),
        Response(200, listing("20", owned("a", "11", "y"), owned("d", "15", "x"))),
    )
    informer = Informer(KIND_TRAINJOB, script, emit, index=owner)
    await run_until_exhausted(informer, script)

    assert checked[-1] == {"y": {"a"}, "x": {"d"}}
    assert [found["metadata"]["name"] for found in informer.indexed("x")] == ["d"]
    assert informer.indexed("z") == []


async def test_cached_objects_share_their_keys_across_answers() -> None:
    """An object from a LIST and one from a watch line, each parsed from its own JSON, hold the
    same key strings: one copy of each key for the whole cache."""

    async def emit(_item: QueueItem) -> None:
        pass

    status = {"conditions": [{"type": "Created", "lastTransitionTime": "t"}]}
    script = Script(
        Response(200, listing("10", {**obj("a", "1"), "status": status})),
        Response(200, lines=[{"type": "ADDED", "object": {**obj("b", "2"), "status": status}}]),
    )
    informer = Informer(KIND_TRAINJOB, script, emit)
    await run_until_exhausted(informer, script)

    def keys(item: dict[str, Any]) -> list[str]:
        condition = item["status"]["conditions"][0]
        return [*item, *item["metadata"], *condition]

    listed, watched = keys(informer.cache["a"]), keys(informer.cache["b"])
    assert listed == watched
    assert all(x is y for x, y in zip(listed, watched, strict=True))
