"""Service test helpers: a function engine over the embedded model's real tokenizer; the run summary.

A real server for an app in a thread is ``deploy.processes.serving``."""

from __future__ import annotations

import pytest

from readers.engines.base import Capabilities, EngineReply, ReadMode, ReadRequest
from readers.engines.function import FunctionEngine


def function_engine(local_engine, fn, mode=ReadMode.TOPK) -> FunctionEngine:
    """A function engine (named as such: it reaches no model) with the embedded model's tokenizer and info."""
    capabilities = Capabilities(read_mode=mode, max_logprobs=32, top_k=32, probe={"engine": "function"})
    return FunctionEngine(
        fn, tokenizer=local_engine.tokenizer, info=local_engine.info, capabilities=capabilities
    )


def favour_first(request: ReadRequest) -> EngineReply:
    """Every label returned, the first most likely (log-probs −0.5, −1.5, −2.5, …; their mass stays below 1)."""
    logprobs = {token: -0.5 - i for i, token in enumerate(request.label_ids)}
    return EngineReply(logprobs, ReadMode.EXACT, len(request.prompt_ids), 1.0)


@pytest.fixture
def quick_engine(local_engine) -> FunctionEngine:
    """Answers every read at once (no model): for HTTP-semantics tests."""
    return function_engine(local_engine, favour_first, ReadMode.EXACT)


RUN_SUMMARIES: list[str] = []
"""Lines a test wants printed at the end of the run even when it passes (the fuzz run's case count)."""


def pytest_terminal_summary(terminalreporter) -> None:
    for line in RUN_SUMMARIES:
        terminalreporter.write_line(line)
