"""The many-options study: its questions, and the shipped tasks the threshold it chose leaves as they were."""

from __future__ import annotations

import pytest

from eval.decisions.many_options import OPTION_COUNTS, STUDY_TASKS, many_option_question
from eval.decisions.tasks import TASKS
from readers.prompt import prompt_layout
from readers.reader import Reader
from service.protocol import SystemOneRequest

STATE = "Shares of the carmaker rose 4% after it raised its yearly forecast."


def test_study_questions_hold_the_task_options_first_and_every_option_described():
    for task_name in STUDY_TASKS:
        own = tuple(TASKS[task_name].options)
        for n in OPTION_COUNTS:
            question = many_option_question(task_name, n)
            assert len(set(question.options)) == n and question.options[: len(own)] == own
            assert all(question.descriptions)
    with pytest.raises(ValueError, match="no 64-option question"):
        many_option_question("ag_news", 64)


def test_the_shipped_tasks_read_as_under_7(local_engine):
    """decide-prompt/9 changes no answer of the shipped tasks (2–6 options): every task's question,
    in both option orders, has /7's prompt and labels, so their test-sample regression table stands."""
    current, seven = Reader(local_engine), Reader(local_engine, layout=prompt_layout("decide-prompt/7"))
    for task in TASKS.values():
        for reversed_options in (False, True):
            body = {"state": STATE, "questions": {"q": task.question(reversed_options=reversed_options)}}
            spec = SystemOneRequest.model_validate(body).questions["q"].to_spec()
            assert current.prepare(spec, STATE) == seven.prepare(spec, STATE), task.name
