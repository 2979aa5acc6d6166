"""``decide``: the one command line. Each command parses, calls one library function, prints."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="Typed decisions with probabilities from open models, in Jev's wire format.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """Quiet the model loaders' progress bars: the CLI prints answers, not loading noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

EngineOption = Annotated[str, typer.Option("--engine", help="local (embedded model, in process) or vllm")]
EngineUrlOption = Annotated[Optional[str], typer.Option("--engine-url", help="vLLM server URL, for --engine vllm")]
TopKOption = Annotated[
    Optional[int], typer.Option("--top-k", help="read only the top-k log-probs (local: emulate a top-k engine; vllm: default 32)")
]
ModelDirOption = Annotated[
    Optional[Path], typer.Option("--model-dir", help="a Hugging Face model folder (default: the embedded SmolLM2)")
]
TokenizerOption = Annotated[
    Optional[str], typer.Option("--tokenizer", help="tokenizer folder or hub id of the vLLM-served model")
]


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to bind")] = 8000,
    engine: EngineOption = "local",
    engine_url: EngineUrlOption = None,
    top_k: TopKOption = None,
    model_dir: ModelDirOption = None,
    tokenizer: TokenizerOption = None,
    workers: Annotated[int, typer.Option(help="local engine: forward passes run at once")] = 2,
) -> None:
    """Serve POST /v1/systemone (and /decide) and GET /v1/models."""
    import uvicorn

    from readers.engines import open_engine
    from service.app import create_app

    async def opener():
        return await open_engine(engine, url=engine_url, model_dir=model_dir, top_k=top_k, tokenizer=tokenizer, workers=workers)

    uvicorn.run(create_app(open_engine=opener), host=host, port=port, log_level="info")


@app.command()
def ask(
    state: Annotated[str, typer.Option(help="the text (or JSON, with --json-state) to decide about")],
    choice: Annotated[Optional[str], typer.Option(help="comma-separated options: a choice question")] = None,
    noul: Annotated[bool, typer.Option("--noul", help="a yes/no question")] = False,
    score: Annotated[Optional[str], typer.Option(help="'|'-separated levels from 0: a score question")] = None,
    instructions: Annotated[Optional[str], typer.Option(help="the question")] = None,
    json_state: Annotated[bool, typer.Option("--json-state", help="parse --state as JSON")] = False,
    url: Annotated[Optional[str], typer.Option(help="ask a running server instead of an in-process one")] = None,
    engine: EngineOption = "local",
    engine_url: EngineUrlOption = None,
    top_k: TopKOption = None,
    model_dir: ModelDirOption = None,
    tokenizer: TokenizerOption = None,
) -> None:
    """Ask one question and print the answer (the same request path as the service)."""
    from service.client import ask_once, one_question

    kinds = [choice is not None, noul, score is not None]
    if sum(kinds) != 1:
        raise typer.BadParameter("give exactly one of --choice, --noul, --score")
    question = one_question(choice=choice, noul=noul, score=score, instructions=instructions)
    body = {"state": json.loads(state) if json_state else state, "questions": {"answer": question}}
    status, reply = asyncio.run(
        ask_once(body, url=url, engine=engine, engine_url=engine_url, top_k=top_k, model_dir=model_dir, tokenizer=tokenizer)
    )
    typer.echo(json.dumps(reply, indent=2, ensure_ascii=False))
    if status >= 400:
        raise typer.Exit(code=1)


if __name__ == "__main__":
    app()
