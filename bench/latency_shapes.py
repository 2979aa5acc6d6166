"""The request shapes bench/latency.py measures: the ticket states and the bodies asked about them.

Option shapes (``noul``, ``choiceN``) ask one question about a shared state; question shapes
(``q1``/``q8``, ``fresh`` or ``cached``) ask 1 or 8 yes/no questions about a ~200-token state.
Every text is tagged with the run's start and a counter (``Bodies``), so nothing of a run was seen by
an engine before it.
"""

from __future__ import annotations

import time

from bench.tickets import QUESTIONS

# About 60 and about 200 tokens of SmolLM2's tokenizer.
SHORT_STATE = (
    "Ticket {tag}. Maria Lopez writes: I was charged twice for my March invoice, $49.99 on the 3rd and "
    "again on the 5th. Please refund the second charge and tell me why it happened."
)
LONG_STATE = (
    "Ticket {tag}. Customer: Maria Lopez, premium plan since 2021, billed monthly. Message: Hi, I was "
    "charged twice for my March invoice, once on the 3rd and again on the 5th, both for $49.99. I already "
    "contacted your chat support last week and the agent promised a refund within three business days, "
    "but nothing has arrived and my bank statement still shows both charges. I also cannot log in to the "
    "mobile app since the last update; it shows a blank screen after the splash logo on my Android phone. "
    "Honestly this is very frustrating, I have recommended you to friends and now I am thinking of "
    "cancelling. Please fix the billing today and tell me when the app will work again. If I do not hear "
    "back by Friday I will dispute the charge with my bank, and I will post about it."
)
# Option names as the reader's 255-name trie test has them (tests/readers/test_label_styles.py): a
# colour and a number, several tokens each, so the token trie of the names grows with their count
# (reads per prompt on SmolLM2's tokenizer: 7 for 4 or 26 options, 71 for 64, 135 for 128, 262 for
# 255). Names that share fewer tokens (product names, say) make a smaller trie and cost less.
OPTION_NAMES = tuple(f"{colour} {i}" for i in range(85) for colour in ("red", "green", "blue"))
OPTION_SHAPES = {
    "noul": 2,
    "choice4": 4,
    "choice26": 26,
    "choice64": 64,
    "choice128": 128,
    "choice255": 255,
    "choice255d": 255,
}
QUESTION_SHAPES = {"q1-fresh": 1, "q8-fresh": 8, "q1-cached": 1, "q8-cached": 8}
SHAPES = tuple(OPTION_SHAPES) + tuple(QUESTION_SHAPES)
# The shapes whose options carry descriptions: listed in the question, they make it long (255 of
# them: several thousand tokens, read again by every content-free prior read).
DESCRIBED = {"choice26", "choice255d"}


class Bodies:
    """Request bodies, each text tagged with this run's start and a counter, so nothing of a run
    was seen by an engine before it (a vLLM server keeps its prefix cache across runs)."""

    def __init__(self, state: str) -> None:
        self.run_tag = f"{time.time_ns() % 10**9:09d}"
        self.count = 0
        self.shared_state = (SHORT_STATE if state == "short" else LONG_STATE).format(tag=f"S-{self.run_tag}")

    def tag(self) -> str:
        self.count += 1
        return f"{self.run_tag}-{self.count}"

    def option_question(self, shape: str) -> dict:
        tag = self.tag()
        if shape == "noul":
            return {"type": "noul", "instructions": f"Form {tag}: does the customer ask for a refund?"}
        names = OPTION_NAMES[: OPTION_SHAPES[shape]]
        criteria = {
            name: (f"tickets the {name} desk handles" if shape in DESCRIBED else None) for name in names
        }
        if shape in DESCRIBED:
            # Tagged too: a layout that lists the options before the state (decide-prompt/9 from six
            # options) would otherwise find the list of an earlier request already computed.
            first = min(names, key=lambda name: (name.casefold(), name))  # listed first (canonical order)
            criteria[first] += f" (form {tag})"
        return {
            "type": "choice",
            "instructions": f"Form {tag}: which desk should handle this ticket?",
            "criteria": criteria,
        }

    def option_body(self, shape: str) -> dict:
        return {"state": self.shared_state, "questions": {"q": self.option_question(shape)}}

    def fresh_state(self) -> str:
        return LONG_STATE.format(tag=self.tag())

    @staticmethod
    def questions_body(state: str, n: int) -> dict:
        return {
            "state": state,
            "questions": {f"q{i}": {"type": "noul", "instructions": QUESTIONS[i]} for i in range(n)},
        }
