"""Prometheus metrics of the service, exposed at ``GET /metrics``.

Each app gets its own registry (tests build many apps). With several worker processes, set
``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode): values are then kept in that
directory and ``/metrics`` aggregates every worker's.

Buckets resolve 5 ms to 5 s: decisions on a warm accelerator take 10–50 ms, CPU reads 100 ms–2 s.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from calibration.probe_cache import ProbeCache
from readers.engines.routed import RoutedEngine

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 1.5, 2.5, 5.0)
MASS_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)
ENGINE_ERROR_KINDS = {
    "engine_unavailable": "unreachable",
    "engine_timeout": "timeout",
    "engine_bad_reply": "malformed",
}
# Why an answer is abstained (service/pipeline/abstain.py): the decide_abstentions label.
ABSTENTION_REASONS = ("uninformative_read", "low_confidence")


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._process_collectors: list[_ProbeCacheCollector] = []  # read at scrape from this process
        r = self.registry
        self.requests = Counter(
            "decide_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.questions = Counter(
            "decide_questions", "Questions answered", ["model", "type", "read_mode"], registry=r
        )
        self.request_seconds = Histogram(
            "decide_request_duration_seconds",
            "End-to-end request latency",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_seconds = Histogram(
            "decide_engine_duration_seconds",
            "Engine call latency per question",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "decide_engine_queue_seconds",
            "Time a read waited for an engine slot",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.labels_missing = Counter(
            "decide_labels_missing", "Labels filled by the floor (missing from the top-k)", registry=r
        )
        self.label_mass = Histogram(
            "decide_label_mass",
            "Vocabulary probability on the returned labels",
            buckets=MASS_BUCKETS,
            registry=r,
        )
        self.answers = Counter(
            "decide_answers", "Answers, by whether a stored calibration applied", ["calibrated"], registry=r
        )
        self.prior_corrected = Counter(
            "decide_prior_corrected_answers",
            "Answers whose read had the content-free option prior divided out",
            registry=r,
        )
        self.abstentions = Counter(
            "decide_abstentions",
            "Answers marked abstained (not to act on), by reason: uninformative_read (no label came back) "
            "or low_confidence (below the question's x_min_confidence)",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "decide_prompt_tokens",
            "Prompt tokens of answered questions' engine reads, by whether the engine computed them "
            "or reused their keys and values (computed ÷ all is what reuse saves)",
            ["kind"],
            registry=r,
        )
        self.engine_errors = Counter("decide_engine_errors", "Engine failures by kind", ["kind"], registry=r)
        # No tenant label: the metrics port takes no key, and tenant names are callers' data.
        self.automatic_refits = Counter(
            "decide_automatic_refits",
            "Refits feedback made due, by outcome: made, skipped over the refit limit (made at a later feedback), or failed: the key's records cannot be fitted in its mode",
            ["outcome"],
            registry=r,
        )
        self.in_flight = Gauge(
            "decide_in_flight_requests", "Requests being served", registry=r, multiprocess_mode="livesum"
        )
        self.engine_info = Gauge(
            "decide_engine_info", "The engine serving decisions (value 1)", ["model", "revision", "engine", "read_mode", "max_logprobs"],
            registry=r, multiprocess_mode="max",
        )  # fmt: skip

        # Per engine behind a routed engine (readers/engines/routed.py), one series per host:port.
        self.route_in_flight = Gauge(
            "decide_route_in_flight_reads",
            "Reads in flight per routed engine",
            ["engine"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.route_reads = Counter(
            "decide_route_reads", "Reads sent per routed engine", ["engine"], registry=r
        )
        self.route_errors = Counter(
            "decide_route_errors", "Failed reads per routed engine, by kind", ["engine", "kind"], registry=r
        )
        self.route_ejections = Counter(
            "decide_route_ejections",
            "Times a routed engine was ejected after a failure",
            ["engine"],
            registry=r,
        )

        # Known label sets start at zero, so rates and ratios exist before the first event.
        for kind in ENGINE_ERROR_KINDS.values():
            self.engine_errors.labels(kind)
        for calibrated in ("true", "false"):
            self.answers.labels(calibrated)
        for reason in ABSTENTION_REASONS:
            self.abstentions.labels(reason)
        for kind in ("computed", "reused"):
            self.prompt_tokens.labels(kind)
        for outcome in ("made", "skipped", "failed"):
            self.automatic_refits.labels(outcome)

    def set_engine(self, engine) -> None:
        self.engine_info.labels(
            engine.info.name,
            engine.info.revision,
            engine.kind,
            engine.capabilities.read_mode.value,
            str(engine.capabilities.max_logprobs),
        ).set(1)
        if isinstance(engine, RoutedEngine):
            engine.observers.append(self)

    def read_started(self, engine: str) -> None:
        """A routed read began on ``engine`` (the RoutingObserver protocol)."""
        self.route_in_flight.labels(engine).inc()
        self.route_reads.labels(engine).inc()

    def read_ended(self, engine: str, error_type: str | None) -> None:
        self.route_in_flight.labels(engine).dec()
        if error_type is not None:
            self.route_errors.labels(engine, ENGINE_ERROR_KINDS.get(error_type, error_type)).inc()

    def ejected(self, engine: str) -> None:
        self.route_ejections.labels(engine).inc()

    def observe_answer(self, model: str, kind: str, reading) -> None:
        """One answered question (a ``service.protocol.ReadingOut``)."""
        self.questions.labels(model, kind, reading.read_mode).inc()
        self.engine_seconds.observe(reading.engine_latency_ms / 1000)
        self.queue_seconds.observe(reading.queued_ms / 1000)
        self.labels_missing.inc(reading.labels_total - reading.labels_returned)
        if reading.label_mass is not None:
            self.label_mass.observe(reading.label_mass)
        self.answers.labels("true" if reading.calibration else "false").inc()
        if reading.prior_correction is not None:
            self.prior_corrected.inc()
        if reading.tokens_computed is not None and reading.tokens_reused is not None:
            self.prompt_tokens.labels("computed").inc(reading.tokens_computed)
            self.prompt_tokens.labels("reused").inc(reading.tokens_reused)
        if not reading.informative:
            self.abstentions.labels("uninformative_read").inc()
        elif reading.abstained:  # an informative read, so the question's minimum confidence abstained it
            self.abstentions.labels("low_confidence").inc()

    def watch_probe_cache(self, cache: ProbeCache) -> None:
        """Expose the store's probe cache (calibration/probe_cache.py), read at each scrape."""
        self._process_collectors.append(_ProbeCacheCollector(cache))
        self.registry.register(self._process_collectors[-1])

    def observe_error(self, error_type: str) -> None:
        kind = ENGINE_ERROR_KINDS.get(error_type)
        if kind:
            self.engine_errors.labels(kind).inc()

    def exposition(self) -> tuple[bytes, str]:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            for collector in self._process_collectors:  # read from this process only: not aggregated
                registry.register(collector)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _ProbeCacheCollector:
    """The probe cache's totals as metrics: what it holds now, how many probes were decoded into it
    and how many it gave back to stay within its bound."""

    def __init__(self, cache: ProbeCache) -> None:
        self.cache = cache

    def collect(self):
        stats = self.cache.stats()
        yield GaugeMetricFamily(
            "decide_probe_cache_bytes", "Bytes of decoded probe weights held", value=stats.bytes
        )
        yield GaugeMetricFamily(
            "decide_probe_cache_probes", "Probe calibrations held decoded", value=stats.probes
        )
        yield CounterMetricFamily(
            "decide_probe_cache_loads",
            "Probes decoded and taken into the cache (a first use, or a fit made here)",
            value=stats.loads,
        )
        yield CounterMetricFamily(
            "decide_probe_cache_evictions",
            "Probes evicted to keep the bound (from the tenant holding the most)",
            value=stats.evictions,
        )
