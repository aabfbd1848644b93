"""Hostile and odd settings documents: the project's own one-line refusal, in bounded time.

Each class is one finding of the fuzz campaign: deep nesting, lone surrogates, long durations,
many credentials, long lists, and messages that broke lines or ran long. Time bounds are growth
ratios (quadrupling the input at most multiplies the time by eight), never wall-clock limits.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_kubeflow.gotime import DurationError, parse_duration_ns
from dispatch_kubeflow.settings import InvalidSettings, parse_settings, parse_settings_object
from dispatch_kubeflow.settings.documents import MAX_CONTAINERS, MAX_DEPTH, decode_json
from dispatch_kubeflow.settings.models import DURATION_MAX, ENTRIES_MAX
from dispatch_kubeflow.settings.names import first_overlap, paths_overlap
from dispatch_kubeflow.settings.refusals import MESSAGE_MAX
from tests.unit.growth import assert_grows_linearly

EXAMPLE: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "examples/settings.json").read_text()
)
PROBE = {"kind": "TrainingRuntime", "name": "probe"}
PYTHON_WORDS = ("Expecting", "utf-8-sig", "sys.", "set_int_max_str_digits", "Input should")


def refused(data: str | bytes) -> InvalidSettings:
    """The refusal of ``data``, checked to be one printable line of bounded length."""
    with pytest.raises(InvalidSettings) as info:
        parse_settings(data)
    message = str(info.value)
    assert message.isprintable(), message
    assert len(message) <= MESSAGE_MAX, len(message)
    message.encode("utf-8")  # no lone surrogate left in it
    for words in PYTHON_WORDS:
        assert words not in message, message
    return info.value


def refusal_of(parse: Any, text: str) -> Exception:
    """The error ``parse`` raises for ``text``, which must be the project's own."""
    with pytest.raises((InvalidSettings, DurationError)) as info:
        parse(text)
    return info.value


def with_key(key: str, value: Any) -> str:
    return json.dumps({**EXAMPLE, key: value})


class TestDeepNesting:
    @pytest.mark.parametrize(
        "text",
        [
            "[" * 1000,
            "[" * 1000 + "]" * 1000,
            '{"a":' * 600 + "1" + "}" * 600,
            '{"labels": ' + "[" * 20 + "]" * 20 + "}",
        ],
    )
    def test_is_refused_before_decoding(self, text: str) -> None:
        error = refused(text)
        assert (error.pointer, error.rule) == ("", f"nested more than {MAX_DEPTH} levels deep")

    def test_within_the_bound_a_wrong_value_keeps_its_pointer(self) -> None:
        nested: Any = "x"
        for _ in range(MAX_DEPTH - 2):  # under the document and kueue
            nested = {"a": nested}
        error = refused(with_key("kueue", {"localQueue": nested}))
        assert (error.pointer, error.rule) == (
            "/kueue/localQueue",
            "must be a string, not an object",
        )

    def test_a_decoded_object_is_refused_where_it_gets_too_deep(self) -> None:
        nested: Any = "x"
        for _ in range(2000):  # deeper than Python's recursion limit
            nested = [nested]
        with pytest.raises(InvalidSettings) as info:
            parse_settings_object({**EXAMPLE, "labels": nested}, pointer="/spec")
        assert info.value.pointer == "/spec/labels" + "/0" * (MAX_DEPTH - 1)
        assert info.value.rule == f"nested more than {MAX_DEPTH} levels deep"

    def test_too_many_containers_are_refused_before_decoding(self) -> None:
        error = refused("[" + "{}," * MAX_CONTAINERS + "{}]")
        assert "more than a settings document can" in error.rule

    def test_the_check_grows_linearly(self) -> None:
        assert_grows_linearly(
            lambda n: "[" + "[[]]," * n + "[]]",
            lambda text: refusal_of(decode_json, text),
            100_000,
        )


class TestLoneSurrogates:
    @pytest.mark.parametrize(
        ("text", "pointer"),
        [
            ('{"labels": {"\\ud800": ""}}', "/labels/\ud800"),
            ('{"\\udfff": ""}', "/\udfff"),
            ('{"namespace": "a\\ud800"}', "/namespace"),
            ('{"annotations": {"k": ["\\ud800"]}}', "/annotations/k/0"),
        ],
    )
    def test_are_refused_with_their_pointer(self, text: str, pointer: str) -> None:
        error = refused(text)
        assert (error.pointer, error.rule) == (pointer, "not valid Unicode (a lone surrogate)")

    def test_the_message_shows_the_escape(self) -> None:
        assert str(refused('{"labels": {"\\ud800": ""}}')).startswith(
            'invalid settings at "/labels/\\ud800": '
        )

    def test_a_surrogate_pair_is_one_character(self) -> None:
        document = json.loads(with_key("annotations", {"k": "\U0001f600"}))
        text = json.dumps(document)  # ensure_ascii: the pair as two escapes
        assert "\\ud83d\\ude00" in text
        assert parse_settings(text).annotations["k"] == "\U0001f600"


class TestDurations:
    def test_the_longest_duration_is_accepted(self) -> None:
        text = "1h" + "0" * (DURATION_MAX - 4) + "1s"
        assert len(text) == DURATION_MAX
        settings_ = parse_settings(with_key("nodeLossWindow", text))
        assert settings_.node_loss_window.total_seconds() == 3601

    def test_a_longer_one_is_refused_before_it_is_parsed(self) -> None:
        error = refused(with_key("nodeLossWindow", "1ns" * 400_000))
        assert (error.pointer, error.rule) == (
            "/nodeLossWindow",
            f"must be a Go duration of at most {DURATION_MAX} characters, got 1200000",
        )

    def test_parse_duration_ns_grows_linearly(self) -> None:
        assert_grows_linearly(lambda n: "1ns" * n, parse_duration_ns, 20_000)

    def test_an_invalid_long_duration_grows_linearly(self) -> None:
        assert_grows_linearly(
            lambda n: "1ns" * n + "x",
            lambda text: refusal_of(parse_duration_ns, text),
            20_000,
        )


class TestListBounds:
    @pytest.mark.parametrize(
        ("key", "entry"),
        [
            ("runtimes", lambda i: {"kind": "TrainingRuntime", "name": f"r{i}"}),
            ("credentials", lambda i: {"secretName": "s", "mountPath": f"/c/{i}"}),
            ("nodeLossTaints", lambda i: f"example.com/t{i}"),
        ],
    )
    def test_lists_hold_at_most_the_bound(self, key: str, entry: Any) -> None:
        full = [entry(i) for i in range(ENTRIES_MAX)]
        assert len(getattr(parse_settings(with_key(key, full)), _field(key))) == ENTRIES_MAX
        error = refused(with_key(key, [*full, entry(ENTRIES_MAX)]))
        assert (error.pointer, error.rule) == (
            f"/{key}",
            f"has {ENTRIES_MAX + 1} entries, more than the {ENTRIES_MAX} allowed",
        )

    @pytest.mark.parametrize("key", ["labels", "annotations"])
    def test_maps_hold_at_most_the_bound(self, key: str) -> None:
        full = {f"k{i}": "v" for i in range(ENTRIES_MAX)}
        assert len(getattr(parse_settings(with_key(key, full)), key)) == ENTRIES_MAX
        error = refused(with_key(key, {**full, "one-more": "v"}))
        assert error.pointer == f"/{key}"

    def test_models_built_in_python_keep_the_bound(self) -> None:
        document = json.loads(with_key("nodeLossTaints", [f"t{i}" for i in range(100)]))
        with pytest.raises(InvalidSettings) as info:
            parse_settings_object(document)
        assert info.value.pointer == "/nodeLossTaints"


def _field(key: str) -> str:
    return {"runtimes": "runtimes", "credentials": "credentials"}.get(key, "node_loss_taints")


class TestCredentialOverlap:
    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.lists(st.sampled_from(["a", "b", "ab", "a b"]), min_size=1, max_size=3).map(
                lambda parts: "/" + "/".join(parts)
            ),
            max_size=8,
        )
    )
    def test_finds_what_comparing_every_pair_finds(self, paths: list[str]) -> None:
        expected = next(
            (
                (later, earlier)
                for later in range(len(paths))
                for earlier in range(later)
                if paths_overlap(paths[later], paths[earlier])
            ),
            None,
        )
        assert first_overlap(paths) == expected

    def test_grows_linearly(self) -> None:
        def make(n: int) -> list[str]:
            paths = [f"/mnt/{i}/secret" for i in range(n)]
            return [*paths, "/mnt"]  # overlaps them all, found last

        assert_grows_linearly(make, first_overlap, 20_000)

    def test_a_credential_containing_another_names_the_earliest(self) -> None:
        credentials = [{"secretName": f"s{i}", "mountPath": f"/m/{i}"} for i in range(10)]
        credentials.append({"secretName": "all", "mountPath": "/m"})
        error = refused(with_key("credentials", credentials))
        assert error.pointer == "/credentials/10/mountPath"
        assert "overlaps /credentials/0/mountPath" in error.rule


class TestMessages:
    @pytest.mark.parametrize("character", ["\u2028", "\u2029", "\u0085", "\n", "\r", "\x1b"])
    def test_stay_on_one_line(self, character: str) -> None:
        error = refused(with_key("labels", {f"a{character}b": f"v{character}"}))
        assert json.dumps(character)[1:-1] in str(error)

    def test_a_huge_key_gives_a_bounded_message_with_its_pointer(self) -> None:
        key = "k" * 100_000
        error = refused(with_key("labels", {key: "v"}))
        assert error.pointer == "/labels/" + key
        assert str(error).startswith("invalid settings at /labels/kkkk")
        assert "\u2026" in str(error)

    def test_a_huge_value_gives_a_bounded_message(self) -> None:
        error = refused(with_key("namespace", "n" * 100_000))
        assert error.pointer == "/namespace"

    def test_a_key_named_like_pydantics_marker_keeps_its_pointer(self) -> None:
        error = refused(with_key("[key]", 1))
        assert (error.pointer, error.rule) == ("/[key]", "unknown key")

    def test_a_top_level_null_is_not_told_to_omit_a_key(self) -> None:
        error = refused("null")
        assert (error.pointer, error.rule) == (
            "",
            "null is not allowed: the settings must be an object",
        )

    def test_a_byte_order_mark_in_the_projects_words(self) -> None:
        error = refused("\ufeff" + json.dumps(EXAMPLE))
        assert "byte-order mark" in error.rule

    @pytest.mark.parametrize("number", ["1" * 5000, "-" + "9" * 10_000, "1e999", "-1e999"])
    def test_a_huge_number_is_a_number_in_the_wrong_place(self, number: str) -> None:
        error = refused('{"namespace": ' + number + "}")
        assert (error.pointer, error.rule) == ("/namespace", "must be a string, not a number")

    @pytest.mark.parametrize(
        "text",
        ['{"a" 1}', '{"a": }', '{"a": 1 "b": 2}', "{'a': 1}", '{"a": "\x01"}', '{"a": "\\x"}'],
    )
    def test_broken_json_in_the_projects_words(self, text: str) -> None:
        assert refused(text).rule.startswith("not valid JSON: ")


def _mutations(document: dict[str, Any], rng: random.Random) -> Any:
    """A handful of the fuzz script's mutations, for a quick property here."""
    document = copy.deepcopy(document)
    key = rng.choice(sorted(document))
    choice = rng.randrange(6)
    if choice == 0:
        document[key] = rng.choice([None, 1e308, -1, True, [], {}, "", "x" * 1000])
    elif choice == 1:
        document[key + rng.choice(["", "x", "\u2028"])] = document.pop(key)
    elif choice == 2:
        del document[key]
    elif choice == 3:
        document[key] = [document[key]] * rng.randrange(70)
    elif choice == 4:
        document["labels"] = {rng.choice(["a", "\ud800", "[key]", "k" * 400]): "v"}
    else:
        document["nodeLossWindow"] = rng.choice(["0", "5", "1h-1m", "1" * 70 + "s", ".s"])
    return document


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32))
def test_mutated_documents_give_one_line_refusals_or_settings(seed: int) -> None:
    rng = random.Random(seed)
    text = json.dumps(_mutations(EXAMPLE, rng), ensure_ascii=rng.random() < 0.5)
    try:
        parse_settings(text)
        message = ""
    except InvalidSettings as error:
        message = str(error)
    assert message.isprintable()
    assert len(message) <= MESSAGE_MAX
