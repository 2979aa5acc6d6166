"""One-shot client: a request through the service's own HTTP path, in process or to a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from readers.engines import open_engine
from service.app import create_app


def one_question(
    *, choice: str | None, noul: bool, score: str | None, instructions: str | None
) -> dict[str, Any]:
    """A Jev question from command-line shorthands."""
    question: dict[str, Any]
    if choice is not None:
        names = [name.strip() for name in choice.split(",")]
        if len(set(names)) != len(names):
            raise ValueError(f"--choice repeats an option: {choice!r}")
        question = {"type": "choice", "criteria": dict.fromkeys(names)}
    elif noul:
        question = {"type": "noul"}
    else:
        assert score is not None
        question = {"type": "score", "criteria": [level.strip() for level in score.split("|")]}
    if instructions is not None:
        question["instructions"] = instructions
    return question


async def ask_once(
    body: dict[str, Any],
    *,
    url: str | None = None,
    engine: str = "local",
    engine_url: str | None = None,
    top_k: int | None = None,
    model: str | None = None,
    model_dir: Path | None = None,
    chat_template: str | None = None,
    tokenizer: str | None = None,
    dtype: str = "float32",
) -> tuple[int, Any]:
    """POST ``body`` to ``url``, or to an in-process app over the given engine (``dtype``: what the local
    engine computes in); (status, JSON)."""
    if url is not None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            response = await client.post("/v1/systemone", json=body)
            return response.status_code, response.json()
    async with await open_engine(
        engine,
        url=engine_url,
        model=model,
        model_dir=model_dir,
        chat_template=chat_template,
        top_k=top_k,
        tokenizer=tokenizer,
        dtype=dtype,
    ) as served:
        transport = httpx.ASGITransport(app=create_app(served))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://in-process", timeout=None
        ) as client:
            response = await client.post("/v1/systemone", json=body)
            return response.status_code, response.json()
