"""``decide serve`` as a library call: check the options, open the store, build the app, run uvicorn.

Every check that can refuse happens before binding, each raising ``ServeRefused`` naming its option, so
a misconfigured service never starts half-way (answering 503 for ever, or listening without keys).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from calibration.probe_cache import DEFAULT_PROBE_CACHE_MIB
from readers.engines.base import DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT_S, LocalBatching
from service.admission import AdmissionLimits
from service.connections import ConnectionLimits
from service.middleware.decompress import DEFAULT_MAX_BODY_BYTES
from service.pipeline.images import ServedImages
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION, PriorCorrection

logger = logging.getLogger("opendecide")


class ServeRefused(ValueError):
    """An option the service cannot start with; ``option`` names it."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    engine: str = "local"
    engine_url: str | None = None
    top_k: int | None = None
    model_dir: Path | None = None
    model: str | None = None
    """An embedded model's name (``readers.embedded.EMBEDDED_MODELS``); None with no ``model_dir``: SmolLM2."""
    chat_template: Path | None = None
    """A jinja file replacing the tokenizer's chat template (as vLLM's ``--chat-template``)."""
    tokenizer: str | None = None
    dtype: str = "float32"
    """What the local engine computes in (``readers.engines.LOCAL_DTYPES``)."""
    batching: LocalBatching = LocalBatching()
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    engine_timeout_s: float = DEFAULT_TIMEOUT_S
    store: str | None = None
    """A SQLite file or a postgresql:// URL; default ``~/.cache/opendecide/calibration.sqlite3``."""
    record_hidden_states: bool = True
    """Store each decision's answer-slot hidden state (the local engine's; what a probe refit fits on).
    Off, the store holds nothing computed from the caller's text but option names and probabilities."""
    probe_cache_mib: float = DEFAULT_PROBE_CACHE_MIB
    """Decoded probe weights kept in memory, all tenants together; past it the tenant holding the most
    gives back (``calibration.probe_cache``)."""
    auto_refit_every: int | None = None
    images: ServedImages = ServedImages()
    api_key_file: Path | None = None
    metrics_port: int | None = None
    """/metrics alone on its own listener, without a key (``service.routes.operations.metrics_app``)."""
    no_auth: bool = False
    rate_limit: tuple[float, int] | None = None
    """(requests per second, burst) per API key."""
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    retention_days: float | None = None
    prior_correction: PriorCorrection = DEFAULT_PRIOR_CORRECTION
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """The decoded body limit of routes without their own (decisions); feedback, refits and examples
    have theirs (``service/middleware/decompress.py:ROUTE_BODY_LIMITS``)."""
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)


def check_engine(options: ServeOptions) -> None:
    """The engine options are usable together (the model itself is checked by ``resolve_model``)."""
    from readers.engines import ENGINE_KINDS, LOCAL_DTYPES

    if options.engine not in ENGINE_KINDS:
        raise ServeRefused(f"choose one of {', '.join(ENGINE_KINDS)}", option="--engine")
    if options.dtype not in LOCAL_DTYPES:
        raise ServeRefused(f"choose one of {', '.join(LOCAL_DTYPES)}", option="--dtype")
    if options.dtype != "float32" and options.engine != "local":
        raise ServeRefused(
            "--dtype sets the local engine's precision; a vLLM server's is its own --dtype", option="--dtype"
        )
    if options.engine == "vllm" and not options.engine_url:
        raise ServeRefused("--engine vllm needs --engine-url", option="--engine-url")
    if options.engine_url:
        from readers.engines.addresses import parse_engine_urls

        try:
            parse_engine_urls(options.engine_url)
        except ValueError as error:
            raise ServeRefused(str(error), option="--engine-url") from None
    if options.model is not None and options.model_dir is not None:
        raise ServeRefused(
            "give --model (an embedded model) or --model-dir (a folder), not both", option="--model"
        )


def read_chat_template(options: ServeOptions) -> str | None:
    """The ``--chat-template`` file's text, read once before binding."""
    if options.chat_template is None:
        return None
    try:
        return options.chat_template.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ServeRefused(
            f"cannot read {options.chat_template}: {error}", option="--chat-template"
        ) from None


def resolve_model(options: ServeOptions) -> Path | None:
    """The model folder the engine reads: ``--model-dir``, or the embedded model (prepared here, before
    binding, on first use) for the local engine or a vLLM engine given ``--model``; None: the vLLM
    server's own tokenizer."""
    from readers.embedded import DEFAULT_EMBEDDED, MANIFEST, ModelUnavailable, UnknownModel, prepared_path
    from readers.engines import model_folder

    if options.engine != "local" and options.model is None:
        return options.model_dir
    try:
        if options.model_dir is None:
            name = options.model or DEFAULT_EMBEDDED
            if not (prepared_path(name) / MANIFEST).is_file():
                logger.info("preparing the embedded model %s from its GGUF (first use only; minutes)", name)
        return model_folder(options.model, options.model_dir)
    except UnknownModel as error:
        raise ServeRefused(str(error), option="--model") from None
    except ModelUnavailable as error:  # its packages are missing: nothing to fix on the command line
        raise ServeRefused(str(error)) from None


def open_local_engine(options: ServeOptions, folder: Path, chat_template: str | None):
    """The local engine, opened before binding so a model that cannot be opened (a folder without
    weights, a tokenizer without a chat template) stops the start instead of answering 503 for ever."""
    import asyncio

    from readers.engines import NoChatTemplate, open_engine

    try:
        return asyncio.run(
            open_engine(
                "local", model_dir=folder, top_k=options.top_k, dtype=options.dtype,
                batching=options.batching, chat_template=chat_template,
            )
        )  # fmt: skip
    except NoChatTemplate as error:
        raise ServeRefused(str(error), option="--chat-template") from None
    # Anything else opening a folder raises (a missing config, weights that do not load, a tokenizer
    # transformers cannot read, each library with its own exception) means the same: it is not a model.
    except Exception as error:
        option = (
            "--model-dir" if options.model_dir is not None else "--model"
        )  # else a damaged prepared folder
        raise ServeRefused(f"{folder} cannot be opened as a model: {error}", option=option) from None


def start_metrics_listener(metrics, host: str, port: int):
    """``/metrics`` alone on ``host:port``, served by its own uvicorn in a daemon thread (so the main
    server keeps its signal handling); returns the server (``should_exit`` stops it) once it listens."""
    import socket
    import threading
    import time

    import uvicorn

    from service.routes.operations import metrics_app

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ServeRefused(
            f"cannot listen on {host}:{port} for metrics: {error}", option="--metrics-port"
        ) from None
    server = uvicorn.Server(uvicorn.Config(metrics_app(metrics), log_level="warning", access_log=False))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="opendecide-metrics", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise ServeRefused(f"the metrics listener on {host}:{port} did not start", option="--metrics-port")
    return server


def open_keyring(options: ServeOptions, environ: dict[str, str] | None = None):
    """The live key set from ``--api-key-file`` and ``$OPENDECIDE_API_KEYS`` (``environ``), or None
    when the service runs without keys: none given, or ``--no-auth`` with a key file that holds none.
    A key file without keys is refused otherwise: serving on loopback without auth while the operator
    means keys to be added later would never read them."""
    from service.keys import EmptyKeyFile, Keyring

    try:
        keyring = Keyring(options.api_key_file, environ)
    except EmptyKeyFile as error:
        if not options.no_auth:
            raise ServeRefused(
                f"{error}: add keys, or pass --no-auth to serve without them", option="--api-key-file"
            ) from None
        keyring = Keyring(None, environ)  # the environment's keys alone, to check them against --no-auth
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise ServeRefused(str(error), option="--api-key-file") from None
    if not keyring.current.keys:
        return None
    if options.no_auth:
        raise ServeRefused("--no-auth and API keys contradict each other", option="--no-auth")
    return keyring


def run_server(options: ServeOptions) -> None:
    """Check everything, then serve until interrupted; the store is closed on the way out.

    SIGHUP is taken from the first instant, before any key is read: its default action would end the
    process (``service.keys.hold_sighup``); the handler in place before is restored on the way out."""
    import signal

    from service.keys import hold_sighup

    previous = hold_sighup("the service is starting; a key file changed meanwhile is read once it serves")
    try:
        _serve(options)
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)


def _serve(options: ServeOptions) -> None:
    import uvicorn

    from calibration.open import open_store
    from calibration.probe_cache import ProbeCache
    from calibration.store import SchemaTooNew
    from readers.embedded import default_cache_dir
    from readers.engines import open_engine
    from service.app import create_app
    from service.connections import KEEP_ALIVE_S, connection_cap, raise_open_file_limit, uvicorn_options
    from service.heap import freeze_startup_heap
    from service.keys import KEYS_ENV, check_bind, hold_sighup, redact_access_log

    check_engine(options)
    if not math.isfinite(options.probe_cache_mib) or options.probe_cache_mib < 0:
        raise ServeRefused("the probe cache cannot be negative (0: keep none)", option="--probe-cache-mib")
    if options.max_body_bytes <= 0:
        raise ServeRefused("the body limit must be positive", option="--max-body-bytes")
    if options.metrics_port is not None and options.metrics_port == options.port:
        raise ServeRefused("--metrics-port must differ from --port", option="--metrics-port")
    chat_template = read_chat_template(options)
    keyring = open_keyring(options)
    if keyring is None:
        hold_sighup("authentication is off: no API keys")
    elif keyring.path is None:
        hold_sighup(f"keys come from ${KEYS_ENV}, read once at start; restart to change them")
    # else a key file: the start-up handler stays until the running service watches the file
    try:
        auth_notice = check_bind(options.host, has_keys=keyring is not None, no_auth=options.no_auth)
    except ValueError as error:
        raise ServeRefused(str(error), option="--host") from None

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # JSON access lines from opendecide.access, engine start-up notes
    if auth_notice:
        logger.warning(auth_notice)
    else:
        logger.info(keyring.current.notice())
    # Last of the checks: preparing a model the first time takes minutes, opening one seconds.
    folder = resolve_model(options)
    local = open_local_engine(options, folder, chat_template) if options.engine == "local" else None

    try:
        store = open_store(
            options.store or default_cache_dir() / "calibration.sqlite3",
            probe_cache=ProbeCache(total_bytes=int(options.probe_cache_mib * 2**20)),
            record_features=options.record_hidden_states,
        )
    except (ConnectionError, SchemaTooNew) as error:
        raise ServeRefused(str(error), option="--store") from None

    async def opener():
        engine = local if local is not None else await open_engine(
            options.engine, url=options.engine_url, model_dir=folder, top_k=options.top_k, tokenizer=options.tokenizer,
            max_in_flight=options.max_in_flight, timeout_s=options.engine_timeout_s, chat_template=chat_template,
        )  # fmt: skip
        # Here, not in create_app: the serving process's long-lived state is complete once its engine
        # is open, and an app built in a test process must not freeze that process's objects.
        freeze_startup_heap()
        return engine

    failures: list[str] = []

    def stop_serving(reason: str) -> None:
        # An engine that cannot open (not one still starting) would answer 503 for ever: exit non-zero.
        failures.append(reason)
        server.should_exit = True

    app = create_app(
        open_engine=opener, store=store, auto_refit_every=options.auto_refit_every, images=options.images,
        api_keys=keyring, rate_limit=options.rate_limit, admission=options.admission,
        retention=dt.timedelta(days=options.retention_days) if options.retention_days else None,
        prior_correction=options.prior_correction, on_engine_failure=stop_serving,
        max_body_bytes=options.max_body_bytes,
    )  # fmt: skip
    metrics_server = None
    limits = connection_cap(options.connections, raise_open_file_limit())
    logger.info(
        "connections: %d at most, %s per client address; request headers within %g s, idle %d s",
        limits.total, limits.per_client or "no bound", limits.header_timeout_s, KEEP_ALIVE_S,
    )  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(app, host=options.host, port=options.port, log_level="info", **uvicorn_options(limits))
    )
    redact_access_log()  # after uvicorn's Config set up its loggers: its access line prints the query
    try:
        if options.metrics_port is not None:
            metrics_server = start_metrics_listener(app.state.metrics, options.host, options.metrics_port)
            logger.info("metrics on http://%s:%d/metrics (no key)", options.host, options.metrics_port)
        server.run()
    finally:
        if metrics_server is not None:
            metrics_server.should_exit = True
        store.close()
    if failures:
        raise ServeRefused(failures[0])
