"""Labelled input of evaluate/calibrate: rows name the right choice of any of the pack's questions;
bad labels are errors naming the row and key; rows without labels are skipped and counted."""

from __future__ import annotations

import pytest

from spinf_stream.labelled import LabelledInputError, read_labelled
from spinf_stream.packs import load_pack

SPAM = load_pack("moderation").expand()  # has spam and asks_to_call


def _write(tmp_path, text: str):
    p = tmp_path / "labelled.jsonl"
    p.write_text(text, encoding="utf-8")
    return p


def test_rows_keep_their_message_and_the_index_of_each_right_choice(tmp_path):
    p = _write(tmp_path, '{"id": "a", "text": "win now", "labels": {"spam": "yes", "asks_to_call": "no"}}\n'
                         '{"id": 7, "text": "hi mum", "labels": {"spam": "no"}}\n')
    got = read_labelled(p, SPAM)
    assert [(r.line, r.message.id, r.labels) for r in got.rows] == [
        (1, "a", {"spam": 0, "asks_to_call": 1}), (2, "7", {"spam": 1})]
    assert got.rows[0].message.fields == {"id": "a", "text": "win now"}  # labels are not a field


def test_rows_without_labels_are_skipped_and_counted(tmp_path):
    p = _write(tmp_path, '{"id": "a", "text": "x"}\n{"id": "b", "text": "y", "labels": {}}\n'
                         '{"id": "c", "text": "z", "labels": {"spam": "no"}}\n')
    got = read_labelled(p, SPAM)
    assert [r.message.id for r in got.rows] == ["c"]
    assert got.skipped_unlabelled == 2


def test_an_unknown_question_is_an_error_naming_the_row_and_key(tmp_path):
    p = _write(tmp_path, '{"id": "a", "text": "x", "labels": {"spam": "no"}}\n'
                         '{"id": "b", "text": "y", "labels": {"scams": "yes"}}\n')
    with pytest.raises(LabelledInputError, match=r"line 2 \(id 'b'\): labels\.scams: no question 'scams' in the pack"):
        read_labelled(p, SPAM)


def test_an_unknown_choice_is_an_error_naming_the_row_key_and_choices(tmp_path):
    p = _write(tmp_path, '{"id": "a", "text": "x", "labels": {"spam": "maybe"}}\n')
    with pytest.raises(LabelledInputError, match=r"line 1 \(id 'a'\): labels\.spam: 'maybe' is not a choice of 'spam' \(yes, no\)"):
        read_labelled(p, SPAM)


def test_every_bad_row_is_reported_at_once(tmp_path):
    p = _write(tmp_path, '{"id": "a", "text": "x", "labels": {"spam": true}}\n'
                         'not json\n'
                         '{"id": "c", "text": "x", "labels": ["spam"]}\n')
    with pytest.raises(LabelledInputError) as e:
        read_labelled(p, SPAM)
    assert len(e.value.problems) == 3
    assert "line 1 (id 'a'): labels.spam: the choice must be a string, got true" in str(e.value)
    assert "line 2: not JSON" in str(e.value)
    assert "line 3 (id 'c'): 'labels' must be an object" in str(e.value)


def _values_pack(tmp_path):
    from spinf_stream.packs import load_pack as lp

    p = tmp_path / "values.yaml"
    p.write_text('name: values\nversion: 1.0.0\ndescription: d\nprompt: "{text}\\n"\nquestion: "{question}"\n'
                 'questions:\n  - {id: amount, text: how much, extract: money}\n  - {id: count, text: how many, extract: number}\n'
                 '  - {id: who, text: who, extract: text}\n  - {id: gist, text: gist, generate: {max_tokens: 5}}\n'
                 '  - {id: spam, text: spam, choices: ["yes", "no"]}\n')
    return lp(p).expand()


def test_extraction_labels_are_values_or_null_for_none(tmp_path):
    from spinf_stream.labelled import Expected

    p = _write(tmp_path, '{"id": "a", "text": "x", "labels": {"amount": {"value": 250, "currency": "GBP"}, "count": 3.5, '
                         '"who": ["Tesco", "Tesco plc"], "spam": "no"}}\n'
                         '{"id": "b", "text": "y", "labels": {"amount": null, "count": null, "who": "Bob", "spam": "yes"}}\n'
                         '{"id": "c", "text": "z", "labels": {"amount": {"value": 5}}}\n')
    rows = read_labelled(p, _values_pack(tmp_path)).rows
    assert rows[0].labels == {"spam": 1} and rows[1].labels == {"spam": 0}
    assert rows[0].expected == {"amount": Expected(value=250.0, currency="GBP"), "count": Expected(value=3.5),
                                "who": Expected(texts=("Tesco", "Tesco plc"))}
    assert rows[1].expected == {"amount": Expected(none=True), "count": Expected(none=True), "who": Expected(texts=("Bob",))}
    assert rows[2].expected == {"amount": Expected(value=5.0)} and rows[2].questions == ["amount"]


@pytest.mark.parametrize(("label", "why"), [
    ('{"count": "3"}', 'labels.count: a number question\'s label is a JSON number or null, got "3"'),
    ('{"count": true}', "labels.count: a number question's label is a JSON number or null, got true"),
    ('{"amount": 250}', 'labels.amount: a money question\'s label is {"value": number, "currency": "ISO code"} or null, got 250'),
    ('{"amount": {"value": 5, "currency": "pounds"}}', 'labels.amount: currency "pounds" is not an ISO 4217 code'),
    ('{"amount": {"value": 5, "cur": "GBP"}}', "labels.amount: a money question's label is"),
    ('{"who": ""}', "labels.who: a text question's label is a non-empty string, a list of them, or null"),
    ('{"who": []}', "labels.who: a text question's label is a non-empty string"),
    ('{"gist": "anything"}', "labels.gist: a generate question takes no labels"),
])
def test_a_bad_extraction_label_is_an_error_naming_the_row_and_key(tmp_path, label, why):
    p = _write(tmp_path, f'{{"id": "a", "text": "x", "labels": {label}}}\n')
    with pytest.raises(LabelledInputError) as e:
        read_labelled(p, _values_pack(tmp_path))
    assert f"line 1 (id 'a'): {why}" in str(e.value)
