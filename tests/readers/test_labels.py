"""Label tokens resolved in context with the embedded model's real tokenizer and chat template."""

from __future__ import annotations

import pytest

from readers.errors import InvalidQuestion
from readers.labels import ChatTemplate, LabelsUnresolvable
from readers.prompt import LabelStyle, QuestionSpec, letter_codes
from readers.reader import Reader


def choice(*options: str) -> QuestionSpec:
    return QuestionSpec("choice", "Which fits?", tuple(options), (None,) * len(options))


def test_each_label_fills_the_slot_with_one_token(tokenizer):
    template = ChatTemplate(tokenizer)
    slot = template.slot("Pick one.", "I loved it.", ("positive", "negative"))
    before, after = template.render("Pick one.", "I loved it.")
    for label, label_id in zip(slot.labels, slot.label_ids):
        full = template.encode(before + label + after)
        closing = template.encode(before + "positive" + after)[len(slot.prompt_ids) + 1 :]
        assert full == [*slot.prompt_ids, label_id, *closing]
        assert tokenizer.decode([label_id]) == label
    assert len(set(slot.label_ids)) == 2


def test_prompt_is_cut_at_the_assistant_answer_slot(tokenizer):
    slot = ChatTemplate(tokenizer).slot("Pick one.", "I loved it.", ("yes", "no"))
    text = tokenizer.decode(list(slot.prompt_ids))
    assert text.endswith("<|im_start|>assistant\n")
    assert text.index("Pick one.") < text.index("I loved it.")  # static part first, state last


def test_resolution_does_not_depend_on_the_state(tokenizer):
    template = ChatTemplate(tokenizer)
    ids = {template.slot("Q", state, ("positive", "negative")).label_ids for state in ["a", "long " * 50, "{}\n"]}
    assert len(ids) == 1


def test_multi_token_label_is_rejected(tokenizer):
    with pytest.raises(LabelsUnresolvable):
        ChatTemplate(tokenizer).slot("Q", "s", ("World", "Sci/Tech"))


def test_reader_recodes_colliding_labels_as_letters(local_engine):
    reader = Reader(local_engine)
    slot, style = reader.prepare(choice("World", "Sci/Tech", "Sports"), "Rocket launch delayed")
    assert style is LabelStyle.CODES
    assert slot.labels == ("A", "B", "C")
    assert len(set(slot.label_ids)) == 3


def test_reader_keeps_words_where_they_resolve(local_engine):
    slot, style = Reader(local_engine).prepare(choice("positive", "negative"), "fine")
    assert style is LabelStyle.WORDS and slot.labels == ("positive", "negative")


def test_options_no_single_token_labels_can_cover_are_refused(local_engine, tokenizer):
    template = ChatTemplate(tokenizer)
    codes = letter_codes(255)
    covered = []
    for code in codes:
        try:
            template.slot("Q", "s", (code, "A" if code != "A" else "B"))
            covered.append(code)
        except LabelsUnresolvable:
            pass
    assert len(covered) < 255, "this tokenizer covers 255 letter codes; pick a larger option count"
    options = tuple(f"option number {i}" for i in range(255))
    with pytest.raises(InvalidQuestion) as raised:
        Reader(local_engine).prepare(choice(*options), "s", loc=("body", "questions", "q"))
    assert raised.value.loc == ("body", "questions", "q", "criteria")
    assert "one distinct token" in raised.value.message
