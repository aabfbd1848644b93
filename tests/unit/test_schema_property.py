"""The parser and schema.json agree on generated documents, but where the seed says they differ.

The seed's "What the schema does not say" lists where the parser is stricter than the schema:
clean mount paths and overlaps between credentials (and with /opt/dispatch by containment), and
the lengths of qualified names. Durations add one more the schema's pattern cannot see: Go's
arithmetic (a fraction below a nanosecond truncates to zero; a value beyond 292 years overflows).
Everywhere else the two accept and refuse the same documents.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dispatch_kubeflow.constants import PUBLISH_DIR, RESERVED_PREFIXES
from dispatch_kubeflow.gotime import DurationError, parse_duration_ns
from dispatch_kubeflow.settings import (
    MOUNT_PATH_PATTERN,
    POSITIVE_DURATION_PATTERN,
    PUBLISH_DIR_INSIDE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    go_path_clean,
    paths_overlap,
)
from tests.unit.test_schema import parser_accepts, schema_accepts


def _matches(pattern: str, value: Any) -> bool:
    return isinstance(value, str) and re.search(pattern.replace("$", r"\Z"), value) is not None


# --- Where the parser may refuse what the schema accepts -----------------------------------------


def _mount_path_differences(credentials: Any) -> Iterator[str]:
    if not isinstance(credentials, list):
        return
    paths = [c.get("mountPath") for c in credentials if isinstance(c, dict)]
    schema_paths: list[str] = [
        p
        for p in paths
        if isinstance(p, str)
        and _matches(MOUNT_PATH_PATTERN, p)
        and p != PUBLISH_DIR
        and not _matches(PUBLISH_DIR_INSIDE_PATTERN, p)
    ]
    for path in schema_paths:
        if go_path_clean(path) != path or path == "/" or paths_overlap(path, PUBLISH_DIR):
            yield f"mount path {path!r}"
    clean = [p for p in schema_paths if go_path_clean(p) == p]
    for i, path in enumerate(clean):
        if any(paths_overlap(path, other) for other in clean[:i]):
            yield f"overlapping mount path {path!r}"


def _qualified_name_too_long(value: Any) -> bool:
    if not _matches(QUALIFIED_NAME_PATTERN, value):
        return False
    prefix, _, name = value.rpartition("/")
    return len(name) > 63 or len(prefix) > 253


def _go_arithmetic_refuses(value: Any) -> bool:
    if not _matches(POSITIVE_DURATION_PATTERN, value):
        return False
    try:
        return parse_duration_ns(value) <= 0
    except DurationError:
        return True


def known_differences(document: Any) -> list[str]:
    """The seed's listed differences (and Go's duration arithmetic) present in ``document``."""
    if not isinstance(document, dict):
        return []
    found = list(_mount_path_differences(document.get("credentials")))
    names: list[Any] = [document.get("gpuResource")]
    for key in ("labels", "annotations"):
        if isinstance(document.get(key), dict):
            names.extend(document[key])
    if isinstance(document.get("nodeLossTaints"), list):
        names.extend(document["nodeLossTaints"])
    found += [f"long qualified name {n!r}" for n in names if _qualified_name_too_long(n)]
    durations = [document.get("nodeLossWindow")]
    if isinstance(document.get("timeouts"), dict):
        durations.extend(document["timeouts"].values())
    found += [f"duration {d!r}" for d in durations if _go_arithmetic_refuses(d)]
    return found


# --- Valid documents ---------------------------------------------------------------------------

dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True)
subdomain = st.lists(dns_label, min_size=1, max_size=3).map(".".join)
name_part = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?", fullmatch=True)
qualified_name = st.one_of(name_part, st.tuples(subdomain, name_part).map("/".join))
metadata_key = qualified_name.filter(lambda k: not k.startswith(RESERVED_PREFIXES))
label_value = st.one_of(st.just(""), name_part)
units = st.sampled_from(["ns", "us", "\u00b5s", "\u03bcs", "ms", "s", "m", "h"])
positive_duration = st.builds(
    lambda first, unit, rest: f"{first}{unit}" + "".join(f"{n}{u}" for n, u in rest),
    st.integers(1, 5000),
    units,
    st.lists(st.tuples(st.integers(0, 5000), units), max_size=2),
)
runtime_ref = st.fixed_dictionaries(
    {"kind": st.sampled_from(["ClusterTrainingRuntime", "TrainingRuntime"]), "name": subdomain}
)
image = st.builds(
    lambda registry, path, digest: f"{registry}{path}@sha256:{digest}",
    st.sampled_from(["", "registry.example/", "localhost:5000/"]),
    # A reference name is at most 255 characters, registry included.
    st.from_regex(r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+)?", fullmatch=True).filter(
        lambda path: len(path) <= 200
    ),
    st.text("0123456789abcdef", min_size=64, max_size=64),
)
path_segment = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,6}", fullmatch=True).filter(
    lambda s: s not in (".", "..", "opt")
)


@st.composite
def credentials(draw: st.DrawFn) -> list[dict[str, str]]:
    # Distinct first segments: no two paths overlap.
    tops = draw(st.lists(path_segment, unique=True, max_size=3))
    return [
        {
            "secretName": draw(subdomain),
            "mountPath": "/" + "/".join([top, *draw(st.lists(path_segment, max_size=2))]),
        }
        for top in tops
    ]


cluster = st.one_of(
    st.just({"inCluster": True}),
    st.fixed_dictionaries(
        {},
        optional={
            "kubeconfig": st.text(max_size=10),
            "context": st.text(min_size=1, max_size=10),
            "inCluster": st.just(False),
        },
    ),
)
kueue = st.fixed_dictionaries(
    {"localQueue": subdomain},
    optional={
        "priorityClass": subdomain,
        "admissionCheck": subdomain,
        "admissionLease": st.fixed_dictionaries({"namespace": dns_label, "name": subdomain}),
    },
)
publish = st.one_of(
    st.fixed_dictionaries(
        {"image": image}, optional={"via": st.sampled_from(["imageVolume", "initContainer"])}
    ),
    st.fixed_dictionaries(
        {"image": image, "via": st.just("initContainer"), "initContainer": dns_label}
    ),
)
timeouts = st.fixed_dictionaries(
    {},
    optional={k: positive_duration for k in ("request", "apiserverRequest", "workload", "stopJob")},
)


def _runtimes_or_probe(document: dict[str, Any]) -> dict[str, Any]:
    if not document.get("runtimes") and "probeRuntime" not in document:
        document["probeRuntime"] = {"kind": "TrainingRuntime", "name": "probe"}
    return document


valid_documents = st.fixed_dictionaries(
    {"namespace": dns_label},
    optional={
        "cluster": cluster,
        "runtimes": st.lists(runtime_ref, max_size=3, unique_by=lambda r: (r["kind"], r["name"])),
        "probeRuntime": runtime_ref,
        "kueue": kueue,
        "labels": st.dictionaries(metadata_key, label_value, max_size=3),
        "annotations": st.dictionaries(metadata_key, st.text(max_size=10), max_size=3),
        "gpuResource": qualified_name,
        "credentials": credentials(),
        "nodeLossWindow": positive_duration,
        "nodeLossTaints": st.lists(qualified_name, unique=True, max_size=3),
        "allowRankRestart": st.booleans(),
        "timeouts": timeouts,
        "publish": publish,
    },
).map(lambda document: _runtimes_or_probe(copy.deepcopy(document)))  # st.just shares values


# --- Breaking them -----------------------------------------------------------------------------

Mutation = Callable[[st.DataObject, dict[str, Any]], None]


def leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(node, dict):
        for key, child in node.items():
            yield from leaves(child, (*path, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from leaves(child, (*path, index))
    if path:
        yield path, node


def put(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = document
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def null_somewhere(data: st.DataObject, document: dict[str, Any]) -> None:
    path, _ = data.draw(st.sampled_from(list(leaves(document))))
    put(document, path, None)


def wrong_type_somewhere(data: st.DataObject, document: dict[str, Any]) -> None:
    path, value = data.draw(st.sampled_from(list(leaves(document))))
    others: list[Any] = [1, 1.5, "false", ["x"], {"x": "y"}, True]
    if isinstance(value, bool):
        others = [0, "true", []]
    elif isinstance(value, str):
        others = [0, 1.0, False, [value], {}]
    elif isinstance(value, dict):
        others = [[], "x", 0, True]
    elif isinstance(value, list):
        others = [{}, "x", 0]
    put(document, path, data.draw(st.sampled_from(others)))


def unknown_key_somewhere(data: st.DataObject, document: dict[str, Any]) -> None:
    objects = [document] + [
        v
        for p, v in leaves(document)
        if isinstance(v, dict) and p[-1] not in ("labels", "annotations")
    ]
    target = data.draw(st.sampled_from(objects))
    target[data.draw(st.sampled_from(["extra", "Namespace", "probe_runtime", "inCluster2"]))] = "x"


def setter(key: str, values: st.SearchStrategy[Any]) -> Mutation:
    def mutate(data: st.DataObject, document: dict[str, Any]) -> None:
        document[key] = data.draw(values)

    return mutate


def nested_setter(
    path: tuple[str, ...], values: st.SearchStrategy[Any], base: dict[str, Any]
) -> Mutation:
    def mutate(data: st.DataObject, document: dict[str, Any]) -> None:
        node = document.setdefault(path[0], copy.deepcopy(base))
        if not isinstance(node, dict):
            node = document[path[0]] = copy.deepcopy(base)
        node[path[1]] = data.draw(values)

    return mutate


BAD_DURATIONS = st.sampled_from(
    ["0", "0s", "-5s", "-0", "5", "5d", "", "1h-5m", "PT5M", " 5s", "5s\n"]
)
MINIMAL_KUEUE = {"localQueue": "lq"}
MINIMAL_PUBLISH = {"image": "x@sha256:" + "0" * 64}

BOTH_REFUSE: dict[str, Mutation] = {
    "null": null_somewhere,
    "wrong type": wrong_type_somewhere,
    "unknown key": unknown_key_somewhere,
    "namespace": setter(
        "namespace", st.sampled_from(["", "A", "a_b", "a" * 64, "-a", "a.b", "a\n"])
    ),
    "node loss window": setter("nodeLossWindow", BAD_DURATIONS),
    "timeout": nested_setter(("timeouts", "stopJob"), BAD_DURATIONS, {}),
    "reserved label": setter(
        "labels", st.sampled_from(RESERVED_PREFIXES).map(lambda p: {p + "x": "v"})
    ),
    "label value": setter(
        "labels", st.sampled_from(["v" * 64, "a b", "-a", "a\n"]).map(lambda v: {"k": v})
    ),
    "label key": setter(
        "annotations", st.sampled_from(["", "a/b/c", "-a", "A.b/c", "a b"]).map(lambda k: {k: "v"})
    ),
    "gpu resource": setter("gpuResource", st.sampled_from(["", "a/", "/a", "a/b/c"])),
    "duplicate runtime": setter("runtimes", runtime_ref.map(lambda r: [r, dict(r)])),
    "duplicate taint": setter("nodeLossTaints", qualified_name.map(lambda t: [t, t])),
    "runtime kind": setter("probeRuntime", st.just({"kind": "Runtime", "name": "x"})),
    "init container without via": setter(
        "publish",
        st.sampled_from([{}, {"via": "imageVolume"}]).map(
            lambda v: {**MINIMAL_PUBLISH, "initContainer": "x", **v}
        ),
    ),
    "in cluster and kubeconfig": setter(
        "cluster",
        st.sampled_from(
            [{"inCluster": True, "kubeconfig": ""}, {"inCluster": True, "context": "c"}]
        ),
    ),
    "empty context": setter("cluster", st.just({"context": ""})),
    "image": nested_setter(
        ("publish", "image"),
        st.sampled_from(
            ["x:v1", "x@sha256:" + "A" * 64, "x@sha256:" + "0" * 63, "@sha256:" + "0" * 64]
        ),
        MINIMAL_PUBLISH,
    ),
    "mount path": setter(
        "credentials",
        st.sampled_from(["relative", "", "/opt/dispatch", "/opt/dispatch/x"]).map(
            lambda p: [{"secretName": "s", "mountPath": p}]
        ),
    ),
    "queue": nested_setter(
        ("kueue", "localQueue"), st.sampled_from(["", "LQ", "a" * 64, "a_b"]), MINIMAL_KUEUE
    ),
    "lease": nested_setter(
        ("kueue", "admissionLease"),
        st.sampled_from([{}, {"name": "x"}, {"namespace": "a.b", "name": "x"}]),
        MINIMAL_KUEUE,
    ),
}

PARSER_REFUSES: dict[str, Mutation] = {
    "unclean mount path": setter(
        "credentials",
        st.sampled_from(["/a/", "//a", "/a/./b", "/a/../b", "/", "/opt"]).map(
            lambda p: [{"secretName": "s", "mountPath": p}]
        ),
    ),
    "overlapping mount paths": setter(
        "credentials",
        st.sampled_from([("/a", "/a"), ("/a", "/a/b"), ("/a/b", "/a")]).map(
            lambda ps: [{"secretName": "s", "mountPath": p} for p in ps]
        ),
    ),
    "long label key": setter(
        "labels",
        st.sampled_from(["n" * 64, "a/" + "n" * 64, "p" * 254 + "/n"]).map(lambda k: {k: "v"}),
    ),
    "long gpu resource": setter("gpuResource", st.just("example.com/" + "n" * 64)),
    "long taint": setter("nodeLossTaints", st.just(["n" * 64])),
    "sub-nanosecond duration": setter(
        "nodeLossWindow", st.sampled_from(["0.1ns", "0.0000000001s"])
    ),
    "overflowing duration": nested_setter(("timeouts", "request"), st.just("3000000h"), {}),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_documents)
def test_valid_documents_both_accept(document: dict[str, Any]) -> None:
    assert schema_accepts(document), document
    assert parser_accepts(document), document


@pytest.mark.parametrize("name", sorted(BOTH_REFUSE))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=valid_documents, data=st.data())
def test_broken_documents_both_refuse(
    document: dict[str, Any], name: str, data: st.DataObject
) -> None:
    BOTH_REFUSE[name](data, document)
    assert not schema_accepts(document), document
    assert not parser_accepts(document), document


@pytest.mark.parametrize("name", sorted(PARSER_REFUSES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=valid_documents, data=st.data())
def test_on_the_listed_differences_the_parser_is_stricter(
    document: dict[str, Any], name: str, data: st.DataObject
) -> None:
    PARSER_REFUSES[name](data, document)
    assert schema_accepts(document), document
    assert not parser_accepts(document), document
    assert known_differences(document), document


# Values of every kind for every key: valid ones, near misses and plain wrong types.
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6))
anything = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=4,
)
near_misses = {
    "namespace": st.one_of(dns_label, st.sampled_from(["", "A", "a" * 64])),
    "gpuResource": st.one_of(qualified_name, st.sampled_from(["n" * 64, "a/", "x/" + "n" * 64])),
    "nodeLossWindow": st.one_of(
        positive_duration, BAD_DURATIONS, st.sampled_from(["0.1ns", "3000000h"])
    ),
    "credentials": st.one_of(
        credentials(),
        st.lists(
            st.fixed_dictionaries(
                {
                    "secretName": st.just("s"),
                    "mountPath": st.sampled_from(
                        ["/a", "/a/", "/", "/opt", "/a/b", "x", "/opt/dispatch"]
                    ),
                }
            ),
            max_size=3,
        ),
    ),
    "labels": st.dictionaries(
        st.one_of(metadata_key, st.sampled_from(["n" * 64, "kueue.x-k8s.io/q", "a/b/c"])),
        st.one_of(label_value, st.sampled_from(["v" * 64, "a b"])),
        max_size=2,
    ),
    "nodeLossTaints": st.lists(st.one_of(qualified_name, st.just("n" * 64)), max_size=3),
    "publish": st.one_of(
        publish,
        st.fixed_dictionaries(
            {"image": st.one_of(image, st.just("x:v1"))},
            optional={
                "via": st.sampled_from(["imageVolume", "initContainer", "x"]),
                "initContainer": dns_label,
            },
        ),
    ),
    "cluster": st.fixed_dictionaries(
        {},
        optional={
            "kubeconfig": st.text(max_size=3),
            "context": st.text(max_size=3),
            "inCluster": st.booleans(),
        },
    ),
}


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_documents, st.data())
def test_parser_and_schema_agree_but_where_the_seed_says(
    document: dict[str, Any], data: st.DataObject
) -> None:
    for key in data.draw(st.lists(st.sampled_from(sorted(near_misses)), max_size=3, unique=True)):
        document[key] = data.draw(st.one_of(near_misses[key], anything))
    schema_says, parser_says = schema_accepts(document), parser_accepts(document)
    event(f"schema {schema_says}, parser {parser_says}")
    if parser_says:
        assert schema_says, document
    elif schema_says:
        assert known_differences(document), document
