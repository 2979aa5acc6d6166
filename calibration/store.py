"""The calibration store: calibrations, decisions and feedback, in SQLite (the default, one file) or
PostgreSQL (shared by replicas). It persists and looks up; fitting lives in ``calibration.fit``.

This module is the contract the backends implement; it knows none of them.
``calibration.open.open_store(location)`` picks one: a ``postgresql://`` (or ``postgres://``) URL opens
``calibration.postgres_store.PostgresStore``, anything else is a file path for
``calibration.sqlite_store.SQLiteStore``. Both keep one contract, checked by one test suite:

- A calibration is keyed by (model, model revision, read version, question type, option count,
  domain); option count and domain may be NULL, meaning "any". Lookup takes the most specific that
  exists: domain (type + count + domain) → type + count → type → none; of several fits of one key,
  the last stored wins. The read version is never relaxed: it is the prompt version
  (``readers.prompt.PROMPT_VERSION``) plus ``+prior`` where the prior correction was divided out
  (built by the service), and either changes what a read is, so a fit made on reads of one version
  never applies to reads of another. Rows stored before versions were recorded are tagged
  ``decide-prompt/1`` (the only layout there was) and kept; they simply stop applying.
- A decision records its uncalibrated probabilities: the read after the prior correction where its
  read version says so, before any calibration; fits are made on them and applied to such reads.
- A calibration has a ``mode``: ``temperature`` (p ∝ exp(z / T)), ``temperature_bias``
  (p ∝ exp(z / T + b), ``bias`` one value per option, so only on keys with an option count),
  ``affine`` (the same form, fitted with a prior toward T = 1, b = 0 that fades with n), or
  ``state_prior`` (the same form with T = 1, b fitted without gold answers: ``calibration.bias``).
  Its ``mode_chosen_by`` says who picked that mode: ``caller`` (the request named it) or ``default``
  (the request named none and got ``calibration.fit.default_mode``). Refits from feedback keep a
  caller's mode and re-apply the defaults to a default's (``calibration.fit.refit_mode``).
- Everything belongs to a tenant (the tenant of the API key that made it; ``default`` for rows from
  before tenants and for services without tenants): decisions, feedback and calibrations. A key's
  ``tenant`` is the tenant whose fits it names; ``None`` is a **shared** fit (published by an admin
  key), which every tenant's lookups fall back on after their own: the tenant's domain → type + count
  → type, then the shared domain → type + count → type. Decisions and feedback are read only by
  their tenant (``decision``, ``gold_rows``, ``recorded`` take the tenant), so no tenant's answers,
  refits or lists depend on another's records.
- Every write is one transaction, durable before the call returns, so an acknowledged write
  survives a crash of the writer (and of SQLite's host or the Postgres server).
- Lookups read a cache, kept in each process's memory, of the latest calibration per key: ``lookup``
  and ``calibrations`` are pure memory and never touch the database, so the service calls them on its
  event loop and a decision's lookup costs the same at 25 stored fits as at 50,000. The cache holds a
  probe's shape, not its weights (tens of kilobytes to megabytes a key): those are loaded on first use
  (``probe``: one query, shared by the answers that ask together) into a bounded ``ProbeCache`` that the tenant holding the most gives
  back from, and ``cached_probe`` reads them from memory after that. A write by this process updates the cache at once. Fits stored
  by other processes reach it without a restart, by
  ``refresh``: one incremental query that reads only the rows stored after the last one seen, never
  the whole table, run by each backend's own background thread (so no caller, and no decision, waits
  on it; each backend says how often and how it knows the order is complete).
- Superseded fits are deleted, not archived: each key (tenant and question key) keeps its latest
  ``keep_fits`` fits (``KEEP_FITS`` by default), pruned in the transaction that stores a new one, and
  ``prune_calibrations`` prunes every key (what a store from before this rule needs once). A key's
  latest fit is never deleted, so the insertion order that makes it the latest survives: the newest
  row of the whole table is always some key's latest, so SQLite never reuses a rowid and Postgres
  never reuses a sequence number. Deleting rather than archiving: an older fit is never applied
  again, the audit log names every stored fit, and the gold answers it was fitted on stay.
- The schema is a numbered list of migrations, applied in order at open and recorded in
  ``schema_migrations``; a store written by a newer version is refused, not guessed at.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from calibration.probe import FoldedProbe, ProbeMap, encode_floats
from calibration.probe_cache import ProbeCache

DEFAULT_TENANT = "default"
"""The tenant of rows stored before tenants, and of every caller of a service without tenants."""
LEGACY_READ_VERSION = "decide-prompt/1"
"""The read version of rows stored before the store recorded one."""
CALIBRATION_MODES = ("temperature", "temperature_bias", "affine", "state_prior", "probe")
RECORDED_LIMIT = 10_000
"""Most recorded decisions a refit without gold answers (``state_prior``) reads (the latest ones)."""
GOLD_LIMIT = 2_000
"""Most gold answers a refit reads (the latest ones): bounds the memory and CPU a refit takes from the
other tenants sharing the service. A probe's ten fits on 1,000 six-option answers take ~1.5 s of one
core and grow with n; a temperature needs far fewer. ``CalibrationStore.feedback_count`` still counts
every one."""
BIAS_MODES = ("temperature_bias", "affine", "state_prior", "probe")
MODE_CHOSEN_BY = ("caller", "default")
"""Who picked a calibration's mode: the request that named it, or the defaults for a request that named none."""
"""Calibration modes that carry one bias per option (applied as softmax(z / T + b))."""
FEATURE_MODES = ("probe",)
"""Calibration modes that read the answer slot's hidden state as well (``calibration.probe``): they
carry a ``ProbeMap`` and apply only to reads that come with the state."""
KEEP_FITS = 20
"""Fits kept per key by default: the latest and the 19 it superseded (``CalibrationStore(keep_fits=…)``)."""


def utc_now() -> str:
    """Now, ISO-8601 UTC with microseconds: the store's timestamps."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class CalibrationKey:
    model: str
    revision: str
    question_type: str
    option_count: int | None = None
    domain: str | None = None
    read_version: str = field(kw_only=True)  # required: no default version to fall back on
    """The prompt version, plus ``+prior`` where the prior correction was divided out of the reads."""
    tenant: str | None = field(default=DEFAULT_TENANT, kw_only=True)
    """Whose fits: a tenant's, or None for the shared fits an admin key published."""

    def fallbacks(self) -> list[CalibrationKey]:
        """This key and the less specific ones, most specific first (same read version): the tenant's
        own, then the shared ones."""
        keys = [self] if self.domain is not None else []
        version, tenant = self.read_version, self.tenant
        keys.append(
            CalibrationKey(
                self.model,
                self.revision,
                self.question_type,
                self.option_count,
                read_version=version,
                tenant=tenant,
            )
        )
        keys.append(
            CalibrationKey(self.model, self.revision, self.question_type, read_version=version, tenant=tenant)
        )
        if tenant is not None:
            keys += self.as_shared().fallbacks()
        return keys

    def as_shared(self) -> CalibrationKey:
        """The same key among the shared fits."""
        return replace(self, tenant=None)


@dataclass(frozen=True)
class Calibration:
    id: str
    model: str
    revision: str
    question_type: str
    option_count: int | None
    domain: str | None
    temperature: float
    n: int
    nll_before: float | None
    nll_after: float | None
    heldout_n: int | None
    heldout_ece_before: float | None
    heldout_ece_after: float | None
    source: str  # examples (gold answers given with them), states, decisions or feedback
    fitted_at: str
    read_version: str
    mode: str = "temperature"
    bias: tuple[float, ...] | None = None
    heldout_ece_floor: float | None = (
        None  # median ECE of calibrated draws at heldout_n (calibration.metrics.ece_floor)
    )
    tenant: str | None = DEFAULT_TENANT  # None: shared, published by an admin key
    mode_chosen_by: str = "caller"  # MODE_CHOSEN_BY; "default": a refit re-applies the defaults at its n
    probe: ProbeMap | None = None  # FEATURE_MODES: the linear term on the hidden state (None in the cache)
    # A probe's shape, which a listing reports: set from ``probe`` and kept when the cache drops it;
    # derived, not a column.
    probe_dimension: int | None = field(default=None, metadata={"column": False})
    probe_members: int | None = field(default=None, metadata={"column": False})

    def __post_init__(self) -> None:
        if self.probe is not None:  # frozen: set once, from the probe it was made with
            object.__setattr__(self, "probe_dimension", self.probe.dimension)
            object.__setattr__(self, "probe_members", self.probe.member_count)

    @property
    def shared(self) -> bool:
        return self.tenant is None

    @property
    def key(self) -> CalibrationKey:
        return CalibrationKey(
            self.model,
            self.revision,
            self.question_type,
            self.option_count,
            self.domain,
            read_version=self.read_version,
            tenant=self.tenant,
        )

    def as_json(self) -> dict:
        """Every field as a store row holds it (the probe as its text; its shape is not a column)."""
        row = {name: getattr(self, name) for name in CALIBRATION_COLUMNS}
        row["bias"] = None if self.bias is None else list(self.bias)
        row["probe"] = None if self.probe is None else self.probe.encoded
        return row


CALIBRATION_COLUMNS = tuple(
    name for name, spec in Calibration.__dataclass_fields__.items() if spec.metadata.get("column", True)
)
"""A calibration's fields as the stores' columns."""


@dataclass(frozen=True)
class DecisionRecord:
    id: str
    model: str
    revision: str
    question_type: str
    option_count: int
    domain: str | None
    options: list[str]
    uncalibrated_probabilities: list[float]
    """The read the key's fits are made on and applied to, before any calibration: the model's own,
    or with the prior correction divided out where ``read_version`` says so (``+prior``)."""
    informative: bool = True
    read_version: str = field(kw_only=True)
    tenant: str = field(default=DEFAULT_TENANT, kw_only=True)
    features: tuple[float, ...] | None = field(default=None, kw_only=True)
    """The answer slot's hidden state where the engine returned it (float32 precision): what a probe
    refit from feedback fits on (``FEATURE_MODES``)."""


class SchemaTooNew(RuntimeError):
    """The store was migrated by a newer opendecide than this one."""


def check_schema_version(applied: int, known: int, where: str) -> None:
    if applied > known:
        raise SchemaTooNew(
            f"{where} is at schema version {applied}; this opendecide knows up to {known}: upgrade it"
        )


class CalibrationStore(ABC):
    """The store contract, and the cache of latest calibrations both backends share.

    Thread-safe: the service calls it from worker threads. ``lookup`` and ``calibrations`` read the
    cache in memory only (no query, on any thread: safe on an event loop); ``probe`` is a coroutine
    for the event loop; every other method is one database round trip (one transaction for writes),
    for a worker thread.
    """

    def __init__(
        self,
        *,
        keep_fits: int = KEEP_FITS,
        probe_cache: ProbeCache | None = None,
        record_features: bool = True,
    ) -> None:
        if keep_fits < 1:
            raise ValueError("keep_fits must be at least 1: a key's latest fit is never deleted")
        self.keep_fits = keep_fits
        # False: decisions are stored without their hidden state (derived from the caller's text), at
        # the cost of probe refits from feedback (docs/security.md).
        self.record_features = record_features
        self.probe_cache = ProbeCache() if probe_cache is None else probe_cache
        # key → (order, calibration); order is the backend's insertion counter, so "latest" does not
        # depend on the clocks of the replicas that wrote the fits.
        self._latest: dict[CalibrationKey, tuple[int, Calibration]] = {}
        self._cache_lock = threading.Lock()
        # (event loop, tenant, calibration id) → the load under way: answers arriving together for a
        # key not yet held share one read of its weights instead of taking a worker thread each.
        self._probe_loads: dict[tuple[object, str | None, str], asyncio.Future] = {}

    # -- the cache ------------------------------------------------------------------------------

    def _remember(self, rows: Iterable[tuple[int, Calibration]]) -> None:
        """Merge stored calibrations into the cache, keeping each key's latest. A merge, never a
        replacement: retention deletes only superseded fits (never one the cache holds), and a
        refresh that read before this process's own newest write committed must not hide that write."""
        # Without the probe's weights: the probe cache holds those for the keys in use.
        rows = [(order, replace(calibration, probe=None)) for order, calibration in rows]
        with self._cache_lock:
            for order, calibration in rows:
                known = self._latest.get(calibration.key)
                if known is None or known[0] < order:
                    self._latest[calibration.key] = (order, calibration)

    @abstractmethod
    def refresh(self) -> int:
        """Merge the fits stored (by any process) after the last one this store has seen into the
        cache: one query, whose cost grows with the new rows only. Returns how many rows it read.
        Each backend's background thread calls it; callers need not, but may (a worker thread, never
        an event loop: it queries)."""

    def calibrations(self, visible_to: str | None = None) -> list[Calibration]:
        """The latest calibration of every key, in the order they were stored; with ``visible_to``, only
        that tenant's and the shared ones."""
        with self._cache_lock:
            latest = [
                calibration for _, calibration in sorted(self._latest.values(), key=lambda pair: pair[0])
            ]
        if visible_to is None:
            return latest
        return [c for c in latest if c.tenant in (visible_to, None)]

    def lookup(self, key: CalibrationKey) -> Calibration | None:
        """The most specific calibration for ``key``: domain → type + count → type → None. Memory only."""
        with self._cache_lock:
            for candidate in key.fallbacks():
                found = self._latest.get(candidate)
                if found is not None:
                    return found[1]
        return None

    def cached_probe(self, calibration: Calibration) -> FoldedProbe | None:
        """The probe of a ``probe`` calibration if this process holds it decoded. Memory only."""
        return self.probe_cache.get(calibration.tenant, calibration.id)

    async def probe(self, calibration: Calibration) -> FoldedProbe | None:
        """The probe of a ``probe`` calibration: held, or loaded (``load_probe``, in a worker thread)
        once however many answers ask for it at the same time. A caller cancelled while it waits
        (its deadline) does not cancel the load the others wait on."""
        held = self.cached_probe(calibration)
        if held is not None:
            return held
        # Only event loops touch the map, each under its own key: no lock needed.
        key = (asyncio.get_running_loop(), calibration.tenant, calibration.id)
        loading = self._probe_loads.get(key)
        if loading is None:

            async def load() -> FoldedProbe | None:
                try:
                    return await asyncio.to_thread(self.load_probe, calibration)
                finally:  # before any waiter resumes; a failed load is tried again by the next answer
                    self._probe_loads.pop(key, None)

            loading = self._probe_loads[key] = asyncio.ensure_future(load())
            # Seen, so that a failure no waiter is left for is not logged as never retrieved.
            loading.add_done_callback(lambda future: future.cancelled() or future.exception())
        return await asyncio.shield(loading)

    def load_probe(self, calibration: Calibration) -> FoldedProbe | None:
        """The probe of a ``probe`` calibration, read from the store and kept in the probe cache (one
        query: a worker thread's call). None if the fit is no longer stored (another replica stored
        newer fits of its key and pruned it before this process's cache saw them)."""
        text = self._probe_text(calibration.id)
        if text is None:
            return None
        probe = ProbeMap(text).folded
        self.probe_cache.put(calibration.tenant, calibration.id, probe)
        return probe

    def add_calibration(
        self,
        key: CalibrationKey,
        *,
        temperature: float,
        n: int,
        source: str,
        mode: str = "temperature",
        bias=None,
        mode_chosen_by: str = "caller",
        probe: ProbeMap | None = None,
        **metrics: float | int | None,
    ) -> Calibration:
        """Store a fit of ``key`` (one durable transaction) and return it as ``lookup`` will (a probe's
        shape, its weights in ``cached_probe``); it is the key's latest."""
        if mode not in CALIBRATION_MODES:
            raise ValueError(f"mode is one of {', '.join(CALIBRATION_MODES)}, not {mode!r}")
        if mode_chosen_by not in MODE_CHOSEN_BY:
            raise ValueError(f"mode_chosen_by is one of {', '.join(MODE_CHOSEN_BY)}, not {mode_chosen_by!r}")
        if (mode in BIAS_MODES) != (bias is not None):
            raise ValueError(f"a {' or '.join(BIAS_MODES)} calibration has a bias, and only it")
        if (mode in FEATURE_MODES) != (probe is not None):
            raise ValueError(f"a {' or '.join(FEATURE_MODES)} calibration has a probe, and only it")
        if probe is not None and probe.options != key.option_count:
            raise ValueError(
                f"a probe has one row per option: {probe.options} for option count {key.option_count}"
            )
        if bias is not None and len(bias) != key.option_count:
            raise ValueError(
                f"a bias has one value per option: {len(bias)} for option count {key.option_count}"
            )
        calibration = Calibration(
            id=f"cal_{uuid.uuid4().hex[:16]}",
            model=key.model,
            revision=key.revision,
            question_type=key.question_type,
            option_count=key.option_count,
            domain=key.domain,
            temperature=float(temperature),
            n=int(n),
            nll_before=metrics.get("nll_before"),
            nll_after=metrics.get("nll_after"),
            heldout_n=metrics.get("heldout_n"),
            heldout_ece_before=metrics.get("heldout_ece_before"),
            heldout_ece_after=metrics.get("heldout_ece_after"),
            heldout_ece_floor=metrics.get("heldout_ece_floor"),
            source=source,
            fitted_at=utc_now(),
            read_version=key.read_version,
            mode=mode,
            bias=None if bias is None else tuple(float(b) for b in bias),
            tenant=key.tenant,
            mode_chosen_by=mode_chosen_by,
            probe=probe,
        )
        self._remember([(self._insert_calibration(calibration), calibration)])
        if probe is not None:  # the key's answers apply it next
            self.probe_cache.put(calibration.tenant, calibration.id, probe.folded)
        return replace(calibration, probe=None)

    # -- the backend's part ---------------------------------------------------------------------

    @abstractmethod
    def _insert_calibration(self, calibration: Calibration) -> int:
        """Write one fit in one durable transaction, deleting in it the key's fits beyond its latest
        ``keep_fits``; return its insertion order (later fits of a key win)."""

    def _features_text(self, decision: DecisionRecord) -> str | None:
        """What a decision's row holds of its hidden state: base64 float32 (``encode_floats``), or NULL
        where it has none or the store does not record them."""
        if decision.features is None or not self.record_features:
            return None
        return encode_floats(decision.features)

    @abstractmethod
    def _probe_text(self, calibration_id: str) -> str | None:
        """The stored probe text of one fit (one query), None if it is not stored."""

    @abstractmethod
    def prune_calibrations(self) -> int:
        """Delete every key's fits beyond its latest ``keep_fits`` (one transaction); returns how many.
        Stores prune a key on each insert; this catches up rows stored before they did."""

    @abstractmethod
    def add_decisions(self, decisions: Iterable[DecisionRecord]) -> None:
        """Record served decisions, all in one transaction, for later feedback."""

    @abstractmethod
    def decision(self, decision_id: str, tenant: str = DEFAULT_TENANT) -> DecisionRecord | None:
        """``tenant``'s recorded decision, or None: another tenant's decision is as unknown as one
        never recorded."""

    @abstractmethod
    def add_feedback(self, decision_id: str, gold: str, tenant: str = DEFAULT_TENANT) -> int:
        """Record ``tenant``'s true answer for its decision; returns the feedback's sequence number.
        Feedback counts only for the tenant of its decision (``gold_rows`` joins on both)."""

    @abstractmethod
    def prune_decisions(self, older_than: dt.datetime) -> int:
        """Delete decisions recorded before ``older_than`` that never got feedback; returns how many.

        Decisions with feedback are kept: they are the gold answers refits are fitted on."""

    @abstractmethod
    def gold_rows(
        self, key: CalibrationKey, *, features: bool = False, limit: int = GOLD_LIMIT
    ) -> list[tuple]:
        """(uncalibrated probabilities, gold index) for the latest ``limit`` decisions of ``key`` (of
        its tenant) with feedback (a decision's latest feedback wins and dates it), in feedback order;
        abstentions (no label came back) carry nothing to fit and are left out. ``features``:
        (uncalibrated probabilities, gold index, the decision's hidden state or None), for a probe
        refit (``FEATURE_MODES``)."""

    @abstractmethod
    def feedback_count(self, key: CalibrationKey) -> int:
        """How many decisions of ``key`` (of its tenant) :func:`gold_rows` would return without a
        limit: one count, not the rows (each feedback asks whether a refit is due)."""

    @abstractmethod
    def recorded(
        self, key: CalibrationKey, limit: int = RECORDED_LIMIT
    ) -> list[tuple[list[str], list[float]]]:
        """(options in the order asked, uncalibrated probabilities) of the latest ``limit``
        informative decisions of ``key`` still stored, with or without feedback, oldest first: what a
        fit without gold answers (``state_prior``) is fitted on."""

    @abstractmethod
    def schema_version(self) -> int:
        """The last migration applied to this store."""

    def close(self) -> None:  # noqa: B027 - a hook: only backends holding connections override it
        """Release connections (and Postgres's listener); the store is unusable afterwards."""


CALIBRATION_KEY_COLUMNS = (
    "tenant",
    "model",
    "revision",
    "read_version",
    "question_type",
    "option_count",
    "domain",
)
"""The columns that name a calibration's key, in the order of the index that prunes by key."""


def calibration_filter(key: CalibrationKey, placeholder: str) -> tuple[str, list]:
    """The WHERE clause selecting exactly ``key``'s stored fits, and its parameters. A None column
    (shared tenant, any count, any domain) is ``IS NULL``: never equal to a value, and a form both
    backends' indexes serve (Postgres's ``IS NOT DISTINCT FROM`` is not)."""
    clauses, params = [], []
    for column in CALIBRATION_KEY_COLUMNS:
        value = getattr(key, column)
        if value is None:
            clauses.append(f"{column} IS NULL")
        else:
            clauses.append(f"{column} = {placeholder}")
            params.append(value)
    return " AND ".join(clauses), params


def gold_filter(key: CalibrationKey, placeholder: str) -> tuple[str, list]:
    """FROM and WHERE of ``key``'s decisions with feedback, each once with its latest feedback
    (abstentions left out): what ``gold_rows`` reads and ``feedback_count`` counts, on either backend."""
    where, params = key_filter(key, placeholder)
    return (
        "FROM feedback f JOIN decisions d ON d.id = f.decision_id AND d.tenant = f.tenant"
        f" WHERE {where} AND d.informative AND f.seq = (SELECT max(seq) FROM feedback"
        " WHERE decision_id = f.decision_id AND tenant = f.tenant)",
        params,
    )


def key_filter(key: CalibrationKey, placeholder: str) -> tuple[str, list]:
    """The WHERE clause (on decisions ``d``) selecting ``key``'s decisions (its tenant's), and its parameters."""
    if key.tenant is None:
        raise ValueError("shared fits hold no decisions: read a tenant's, then publish the fit as shared")
    clauses = [
        f"d.tenant = {placeholder}",
        f"d.model = {placeholder}",
        f"d.revision = {placeholder}",
        f"d.read_version = {placeholder}",
        f"d.question_type = {placeholder}",
    ]
    params: list = [key.tenant, key.model, key.revision, key.read_version, key.question_type]
    if key.option_count is not None:
        clauses.append(f"d.option_count = {placeholder}")
        params.append(key.option_count)
    if key.domain is not None:
        clauses.append(f"d.domain = {placeholder}")
        params.append(key.domain)
    return " AND ".join(clauses), params
