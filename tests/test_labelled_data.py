"""``spinf-stream labels`` (``spinf_stream.label_sets``): a data set's labels become the right
choices of a pack's questions through the mapping in the pack's folder."""

from __future__ import annotations

import shutil

import orjson
import pytest
from conftest import REPO

from spinf_stream.label_sets import LabelSetError
from spinf_stream.labelled import read_labelled
from spinf_stream.packs import load_pack


def _script():
    from spinf_stream import label_sets

    return label_sets


@pytest.fixture
def setup(tmp_path):
    """A copy of the moderation pack with a mapping, and a tiny data set."""
    packs = tmp_path / "packs"
    (packs / "moderation").mkdir(parents=True)
    shutil.copy(REPO / "packs" / "moderation.yaml", packs / "moderation.yaml")
    data = tmp_path / "data" / "toy"
    data.mkdir(parents=True)
    rows = [
        {"id": "t1", "text": "a", "label": "toxic,insult"},
        {"id": "t2", "text": "b", "label": "none"},
        {"id": "t3", "text": "c", "label": "threat"},
        {"id": "t4", "text": "d", "label": "insult,toxic"},
        {"id": "t5", "text": "e", "label": "none"},
    ]
    (data / "dev.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return packs, tmp_path / "data"


def _mapping(packs, text: str) -> None:
    (packs / "moderation" / "data.yaml").write_text(text)


def test_split_labels_take_the_first_mapped_key_found_and_unmapped_rows_are_left_out(setup):
    packs, data = setup
    _mapping(packs, 'sets:\n  - data: toy\n    split: ","\n    labels:\n'
                    '      toxic: {toxic: "yes", none: "no"}\n      insult: {insult: "yes", none: "no"}\n')
    rows = _script().labelled_rows(packs / "moderation.yaml", data)
    assert [(r["id"], r["labels"]) for r in rows] == [
        ("t1", {"toxic": "yes", "insult": "yes"}), ("t2", {"toxic": "no", "insult": "no"}),
        ("t4", {"toxic": "yes", "insult": "yes"}), ("t5", {"toxic": "no", "insult": "no"}),
    ]
    assert set(rows[0]) == {"id", "text", "labels"}


def test_rows_and_per_label_limit_what_is_taken(setup):
    packs, data = setup
    _mapping(packs, 'sets:\n  - data: toy\n    rows: 2\n    labels:\n      toxic: {none: "no", threat: "yes"}\n')
    assert [r["id"] for r in _script().labelled_rows(packs / "moderation.yaml", data)] == ["t2"]
    _mapping(packs, 'sets:\n  - data: toy\n    per_label: 1\n    labels:\n      toxic: {none: "no", threat: "yes"}\n')
    assert [r["id"] for r in _script().labelled_rows(packs / "moderation.yaml", data)] == ["t2", "t3"]


def test_held_out_rows_are_the_next_of_each_label_and_never_among_those_taken(setup):
    packs, data = setup
    _mapping(packs, 'sets:\n  - data: toy\n    per_label: 1\n    held_out: 1\n    labels:\n'
                    '      toxic: {none: "no", threat: "yes"}\n')
    ls = _script()
    assert [r["id"] for r in ls.labelled_rows(packs / "moderation.yaml", data)] == ["t2", "t3"]
    assert [r["id"] for r in ls.labelled_rows(packs / "moderation.yaml", data, held_out=True)] == ["t5"]
    _mapping(packs, 'sets:\n  - data: toy\n    per_label: 1\n    labels:\n      toxic: {none: "no", threat: "yes"}\n')
    assert ls.labelled_rows(packs / "moderation.yaml", data, held_out=True) == []  # none stated: none held out
    _mapping(packs, 'sets:\n  - data: toy\n    rows: 2\n    held_out: 2\n    labels:\n      toxic: {none: "no", threat: "yes"}\n')
    assert [r["id"] for r in ls.labelled_rows(packs / "moderation.yaml", data)] == ["t2"]
    assert [r["id"] for r in ls.labelled_rows(packs / "moderation.yaml", data, held_out=True)] == ["t3"]  # t4: unmapped

def test_a_mapping_to_a_choice_the_question_lacks_is_refused(setup):
    packs, data = setup
    _mapping(packs, 'sets:\n  - data: toy\n    labels:\n      toxic: {none: "nope"}\n')
    with pytest.raises(LabelSetError, match="'nope' is not a choice of 'toxic'"):
        _script().labelled_rows(packs / "moderation.yaml", data)


def test_every_shipped_mapping_names_questions_and_choices_of_its_pack():
    script = _script()
    for mapping in sorted((REPO / "packs").glob("*/data.yaml")):
        pack_file = mapping.parent.parent / f"{mapping.parent.name}.yaml"
        sets = script.load_mapping(pack_file)
        assert sets, mapping


def test_written_rows_are_valid_labelled_input(setup, tmp_path):
    packs, data = setup
    _mapping(packs, 'sets:\n  - data: toy\n    split: ","\n    labels:\n      toxic: {toxic: "yes", none: "no"}\n')
    rows = _script().labelled_rows(packs / "moderation.yaml", data)
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    got = read_labelled(path, load_pack(packs / "moderation.yaml").expand())
    assert [r.labels for r in got.rows] == [{"toxic": 0}, {"toxic": 1}, {"toxic": 0}, {"toxic": 1}]


def test_values_label_a_text_extraction_with_the_meta_field_s_first_words_where_the_text_holds_them(tmp_path):
    script = _script()
    assert script.first_words("Samsung RB41J7255SR Stainless Steel", "samsung rb41j7255sr 410l fridge") == ["Samsung"]
    assert script.first_words("Fisher & Paykel E522B", "fisher & paykel e522b fridge") == ["Fisher", "Fisher &"]
    assert script.first_words("Russell Hobbs RHM2076", "russell hobbs 20l microwave") == ["Russell", "Russell Hobbs"]
    assert script.first_words("Bosch KGN36", "kgn36 fridge freezer") == []  # the title lacks the brand
    packs = tmp_path / "packs"
    (packs / "shop").mkdir(parents=True)
    (packs / "shop.yaml").write_text('name: shop\nversion: 1.0.0\ndescription: d\nprompt: "{text}\\n"\nquestion: "{question}"\n'
                                     'questions:\n  - {id: brand, text: which brand, extract: text}\n')
    (packs / "shop" / "data.yaml").write_text("sets:\n  - data: toy\n    values:\n      brand: {meta: cluster_label}\n")
    data = tmp_path / "data" / "toy"
    data.mkdir(parents=True)
    rows = [{"id": "a", "text": "beko fridge 50cm", "label": "Fridges", "meta": {"cluster_label": "Beko TZ55"}},
            {"id": "b", "text": "a fridge 50cm", "label": "Fridges", "meta": {"cluster_label": "Beko TZ56"}}]
    (data / "dev.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    got = script.labelled_rows(packs / "shop.yaml", tmp_path / "data")
    assert got == [{"id": "a", "text": "beko fridge 50cm", "labels": {"brand": ["Beko"]}}]
    (packs / "shop" / "data.yaml").write_text("sets:\n  - data: toy\n    values:\n      colour: {meta: cluster_label}\n")
    with pytest.raises(LabelSetError, match="values.colour: no text extraction question 'colour'"):
        script.load_mapping(packs / "shop.yaml")


def test_the_labels_command_writes_the_rows_and_says_what_is_wrong_in_one_line(setup, tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    packs, data = setup
    (packs / "moderation" / "data.yaml").write_text(
        "sets:\n  - data: toy\n    labels:\n      toxic: {toxic: 'yes', none: 'no'}\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPINF_")}, "SPINF_PACKS_DIR": str(packs)}
    out = tmp_path / "rows.jsonl"

    def labels(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "spinf_stream.cli", "labels", "--pack", "moderation", *args],
                              cwd=REPO, env={**env, **extra}, capture_output=True, text=True, timeout=60)

    r = labels("--data", str(data), "--output", str(out))
    assert r.returncode == 0, r.stderr
    want = _script().labelled_rows(packs / "moderation.yaml", data)
    assert [orjson.loads(x) for x in out.read_bytes().splitlines()] == want and len(want) == 2  # rows with a mapped label
    assert labels("--output", str(out), SPINF_DATA_DIR=str(data)).returncode == 0  # the variable, as the tests read it
    missing = labels("--data", str(tmp_path / "nowhere"), "--output", str(out))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "data set 'toy': cannot read" in missing.stderr and "--data DIR or set SPINF_DATA_DIR" in missing.stderr
    unknown = labels("--pack", "spma")
    assert unknown.returncode == 2 and "no such pack" in unknown.stderr
