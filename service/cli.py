"""Service commands: ``decide serve`` and ``decide ask``. Each parses, calls one library function, prints."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from readers.engines.base import LocalBatching
from service.admission import AdmissionLimits
from service.connections import ConnectionLimits
from service.pipeline.images import ServedImages
from service.pipeline.options import (
    ChatTemplateOption,
    DtypeOption,
    EngineOption,
    EngineUrlOption,
    ModelDirOption,
    ModelOption,
    PriorCorrectionOption,
    TokenizerOption,
    TopKOption,
    quiet_loaders,
)
from service.server import ServeOptions, ServeRefused, run_server

app = typer.Typer()
# The flags show the library's defaults: ServeOptions' fields, each defined once where its setting lives.
DEFAULT = ServeOptions()


def local_batching(batch_window_ms: float, max_batch: int, prefix_cache_mib: float):
    """The batching options, a bad one refused by its flag's name."""
    try:
        return LocalBatching(batch_window_ms, max_batch, prefix_cache_mib)
    except ValueError as error:
        flag = "--" + str(error).split(" ", 1)[0].replace("_", "-")
        raise typer.BadParameter(str(error), param_hint=flag) from None


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = DEFAULT.host,
    port: Annotated[int, typer.Option(help="port to bind")] = DEFAULT.port,
    engine: EngineOption = DEFAULT.engine,
    engine_url: Annotated[
        str | None,
        typer.Option(
            "--engine-url",
            help="vLLM server URL, for --engine vllm; several comma-separated, or dns+http://NAME:PORT for every "
            "address of NAME (re-resolved every 10 s): reads are routed by prefix affinity (docs/fleet.md, Routing)",
        ),
    ] = None,
    top_k: TopKOption = None,
    model: ModelOption = None,
    model_dir: ModelDirOption = None,
    chat_template: ChatTemplateOption = None,
    tokenizer: TokenizerOption = None,
    dtype: DtypeOption = DEFAULT.dtype,
    batch_window_ms: Annotated[
        float, typer.Option(help="local engine: how long a batch waits for more reads")
    ] = DEFAULT.batching.batch_window_ms,
    max_batch: Annotated[
        int, typer.Option(help="local engine: reads in one forward pass at most")
    ] = DEFAULT.batching.max_batch,
    prefix_cache_mib: Annotated[
        float, typer.Option(help="local engine: MiB of state KV kept for states seen again (0: off)")
    ] = DEFAULT.batching.prefix_cache_mib,
    store: Annotated[
        str | None,
        typer.Option(
            help="calibration store: a SQLite file (default ~/.cache/opendecide/calibration.sqlite3) or a postgresql:// URL shared by replicas"
        ),
    ] = None,
    auto_refit_every: Annotated[
        int | None, typer.Option(help="refit a calibration from feedback every N labels")
    ] = None,
    record_hidden_states: Annotated[
        bool,
        typer.Option(
            help="store each decision's answer-slot hidden state (local engine), what probe refits from feedback fit on; it is computed from the caller's text"
        ),
    ] = DEFAULT.record_hidden_states,
    probe_cache_mib: Annotated[
        float,
        typer.Option(
            help="MiB of decoded probe calibrations kept in memory, all tenants; past it the tenant holding the most gives back (0: none)"
        ),
    ] = DEFAULT.probe_cache_mib,
    max_in_flight: Annotated[
        int, typer.Option(help="vllm engine: requests in flight at once (like --max-num-seqs)")
    ] = DEFAULT.max_in_flight,
    engine_timeout: Annotated[
        float, typer.Option(help="vllm engine: seconds to wait for a reply")
    ] = DEFAULT.engine_timeout_s,
    engine_image: Annotated[
        str | None,
        typer.Option(help="the engine's container image by digest (repo@sha256:…), reported in every answer"),
    ] = None,
    service_image: Annotated[
        str | None, typer.Option(help="this service's container image by digest, reported in every answer")
    ] = None,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            help="API keys, one per line, each optionally with tenant=NAME scopes=decide,calibrate,admin cache_group=NAME "
            "(also $OPENDECIDE_API_KEYS); a regular file with at least one key (else refused, unless --no-auth); "
            "re-read when it changes and on SIGHUP; callers send Authorization: Bearer KEY"
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="serve /metrics on this port too, without a key (on the main port it needs an admin key)"
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="serve without API keys on a non-loopback address, or with an --api-key-file that holds none (anyone who can reach it may call)",
        ),
    ] = False,
    rate_limit: Annotated[
        float | None, typer.Option(help="requests per second per API key (429 beyond); default: no limit")
    ] = None,
    rate_burst: Annotated[
        int, typer.Option(help="requests a key may send at once before --rate-limit applies")
    ] = 20,
    max_cost_in_flight: Annotated[
        int, typer.Option(help="prompt tokens (summed over reads) being read at once")
    ] = DEFAULT.admission.in_flight_cost,
    max_cost_queued: Annotated[
        int, typer.Option(help="prompt tokens waiting for admission; beyond it 529 overloaded_error")
    ] = DEFAULT.admission.queued_cost,
    max_tenant_cost_queued: Annotated[
        int,
        typer.Option(
            help="prompt tokens one tenant may have waiting; beyond it 429 while other tenants have work (529 alone)"
        ),
    ] = DEFAULT.admission.tenant_queued_cost,
    max_request_cost: Annotated[
        int,
        typer.Option(
            help="prompt tokens one request may schedule over its reads (priors on first sight included); beyond it 413"
        ),
    ] = DEFAULT.admission.request_cost,
    max_queue_wait: Annotated[
        float,
        typer.Option(
            help="seconds of expected wait (queued prompt tokens at the measured rate) beyond which a request gets 529 at once"
        ),
    ] = DEFAULT.admission.max_wait_s,
    deadline: Annotated[
        float,
        typer.Option(
            help="seconds a request may take, queue included; past it 504 and its reads are stopped"
        ),
    ] = DEFAULT.admission.deadline_s,
    retention_days: Annotated[
        float | None,
        typer.Option(help="delete decision records without gold answers older than this (default: keep)"),
    ] = None,
    prior_correction: PriorCorrectionOption = DEFAULT.prior_correction,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            help="decoded request body limit of the decision routes (413 beyond); feedback and refits have 64 KiB, examples 4 MiB"
        ),
    ] = DEFAULT.max_body_bytes,
    header_timeout: Annotated[
        float,
        typer.Option(help="seconds a connection has to send a request's headers; past it 408 and closed"),
    ] = DEFAULT.connections.header_timeout_s,
    max_connections_per_client: Annotated[
        int,
        typer.Option(
            help="open connections from one client address; one more gets 503 and is closed (0: no bound, behind a proxy)"
        ),
    ] = DEFAULT.connections.per_client,
    max_connections: Annotated[
        int,
        typer.Option(
            help="open connections in all (at most the open-file limit less 256); one more gets 503 and is closed"
        ),
    ] = DEFAULT.connections.total,
) -> None:
    """Serve decisions: Jev's POST /v1/systemone (and /decide, /decide/batch), OpenAI's POST /v1/decisions,
    Google's POST /v1beta/decisions; GET /v1/models; calibrations and feedback."""
    quiet_loaders()
    try:
        options = ServeOptions(
            host=host, port=port, engine=engine, engine_url=engine_url, top_k=top_k, model=model, model_dir=model_dir,
            chat_template=chat_template, tokenizer=tokenizer, dtype=dtype, batching=local_batching(batch_window_ms, max_batch, prefix_cache_mib), max_in_flight=max_in_flight, engine_timeout_s=engine_timeout, store=store, record_hidden_states=record_hidden_states, probe_cache_mib=probe_cache_mib,
            auto_refit_every=auto_refit_every, images=ServedImages(engine=engine_image, service=service_image),
            api_key_file=api_key_file, metrics_port=metrics_port, no_auth=no_auth, rate_limit=(rate_limit, rate_burst) if rate_limit else None,
            admission=AdmissionLimits(in_flight_cost=max_cost_in_flight, queued_cost=max_cost_queued, request_cost=max_request_cost,
                                    tenant_queued_cost=max_tenant_cost_queued, max_wait_s=max_queue_wait, deadline_s=deadline),
            retention_days=retention_days, prior_correction=prior_correction, max_body_bytes=max_body_bytes,
            connections=ConnectionLimits(header_timeout, max_connections_per_client, max_connections),
        )  # fmt: skip
        run_server(options)
    except ServeRefused as error:
        if error.option is None:  # nothing to fix on the command line (e.g. the embedded model's wheel)
            typer.echo(f"Error: {error}", err=True)
            raise typer.Exit(code=1) from None
        raise typer.BadParameter(str(error), param_hint=error.option) from None
    except ValueError as error:  # limits out of range
        raise typer.BadParameter(str(error)) from None


@app.command()
def ask(
    state: Annotated[str, typer.Option(help="the text (or JSON, with --json-state) to decide about")],
    choice: Annotated[str | None, typer.Option(help="comma-separated options: a choice question")] = None,
    noul: Annotated[bool, typer.Option("--noul", help="a yes/no question")] = False,
    score: Annotated[str | None, typer.Option(help="'|'-separated levels from 0: a score question")] = None,
    instructions: Annotated[str | None, typer.Option(help="the question")] = None,
    json_state: Annotated[bool, typer.Option("--json-state", help="parse --state as JSON")] = False,
    url: Annotated[str | None, typer.Option(help="ask a running server instead of an in-process one")] = None,
    engine: EngineOption = DEFAULT.engine,
    engine_url: EngineUrlOption = None,
    top_k: TopKOption = None,
    model: ModelOption = None,
    model_dir: ModelDirOption = None,
    chat_template: ChatTemplateOption = None,
    tokenizer: TokenizerOption = None,
    dtype: DtypeOption = DEFAULT.dtype,
) -> None:
    """Ask one question and print the answer (the same request path as the service)."""
    quiet_loaders()
    from readers.embedded import ModelUnavailable
    from readers.engines import NoChatTemplate
    from service.client import ask_once, one_question
    from service.server import check_engine

    kinds = [choice is not None, noul, score is not None]
    if sum(kinds) != 1:
        raise typer.BadParameter("give exactly one of --choice, --noul, --score")
    try:
        question = one_question(choice=choice, noul=noul, score=score, instructions=instructions)
        body = {"state": json.loads(state) if json_state else state, "questions": {"answer": question}}
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    if model is not None and model_dir is not None:
        raise typer.BadParameter("give --model (an embedded model) or --model-dir (a folder), not both")
    if url is not None and dtype != DEFAULT.dtype:
        raise typer.BadParameter(
            "--url asks a running server, which computes in its own --dtype", param_hint="--dtype"
        )
    if url is None:  # the in-process engine takes serve's engine options, refused as serve refuses them
        try:
            check_engine(
                ServeOptions(
                    engine=engine, engine_url=engine_url, model=model, model_dir=model_dir, dtype=dtype
                )
            )
        except ServeRefused as error:
            raise typer.BadParameter(str(error), param_hint=error.option) from None
    try:
        template = chat_template.read_text() if chat_template else None
    except (OSError, UnicodeDecodeError) as error:
        raise typer.BadParameter(str(error), param_hint="--chat-template") from None
    try:
        status, reply = asyncio.run(
            ask_once(
                body, url=url, engine=engine, engine_url=engine_url, top_k=top_k, model=model,
                model_dir=model_dir, chat_template=template, tokenizer=tokenizer, dtype=dtype,
            )
        )  # fmt: skip
    except ModelUnavailable as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(code=1) from None
    except NoChatTemplate as error:
        raise typer.BadParameter(str(error), param_hint="--chat-template") from None
    typer.echo(json.dumps(reply, indent=2, ensure_ascii=False))
    if status >= 400:
        raise typer.Exit(code=1)
