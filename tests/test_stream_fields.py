"""The service works with any field names a pack uses: ``--too-long truncate`` cuts the longest of
them, and ``--input-format text`` fills the pack's one field (a pack with several is refused)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spinf_stream.engine.results import ErrorInfo, ErrorRecord
from spinf_stream.stream.scorer import prepare_messages


class TwoFieldScorer:
    """Accepts a message while its ``title`` and ``body`` together hold at most 50 characters."""

    pack = SimpleNamespace(name="news", version="1", fields=("title", "body"))

    def prepare(self, messages):
        out = []
        for m in messages:
            size = len(m.fields["title"]) + len(m.fields["body"])
            out.append(ErrorRecord(id=m.id, error=ErrorInfo(kind="too_long", message="x")) if size > 50 else SimpleNamespace(id=m.id, fields=dict(m.fields), n_tokens=size, cost_tokens=size))
        return out


def test_truncate_cuts_the_longest_pack_field_to_the_longest_prefix_that_fits():
    fields = {"title": "A short title", "body": "b" * 200, "other": "z" * 500}  # 'other' is not the pack's
    (p,) = prepare_messages(TwoFieldScorer(), lambda i, f: SimpleNamespace(id=i, fields=f), [("m1", fields)], "truncate")
    assert p.truncated is not None
    assert (p.truncated.field, p.truncated.original_chars, p.truncated.kept_chars) == ("body", 200, 50 - len("A short title"))
    assert p.item.fields["body"] == "b" * 37 and p.item.fields["title"] == "A short title"


def _settings(**kw):
    from spinf_stream.config import RunSettings

    return RunSettings.model_validate({"bootstrap_servers": "127.0.0.1:1", **kw})


def test_text_input_with_a_pack_of_several_fields_is_refused_naming_them():
    from spinf_stream.errors import UsageError
    from spinf_stream.stream.service import ScoringService

    scorer = TwoFieldScorer()
    scorer.model_info = None
    with pytest.raises(UsageError, match=r"exactly one field; news uses \{title\}, \{body\}"):
        ScoringService(_settings(input_format="text"), scorer)


def test_text_input_fills_the_packs_one_field_whatever_its_name():
    from spinf_stream.stream.service import ScoringService

    scorer = TwoFieldScorer()
    scorer.pack = SimpleNamespace(name="reviews", version="1", fields=("review",))
    scorer.model_info = None
    assert ScoringService(_settings(input_format="text"), scorer)._preparer._text_fields == {"default": "review"}
