"""Capacity planning (``decide plan``): chips and service replicas for a decision rate within a p99.

The model, stated once:

- A chip's measured load sweep (``decide eval load``: closed-loop clients at concurrency c) gives, per c,
  the decisions/s it sustained X(c) and the p99 latency L99(c). X rises with c until the engine saturates.
- Offered an open rate λ (decisions/s) below its largest measured X (its peak μ), a chip's p99 is two terms:
  the latency of serving at that load, L99 interpolated at the concurrency where X(c) = λ (linearly in λ
  between the measured points bracketing it), plus the wait that random arrivals add and a closed loop
  never shows: M/M/1 with service rate μ, whose waiting time exceeds t with probability ρ·e^(−(μ−λ)t),
  so its p99 is ln(100ρ)/(μ−λ) (zero while ρ ≤ 1%). No point is extrapolated: a rate at or above μ has
  no prediction.
- Checked on two vLLM-CPU engines here (evidence/routing-2026-11-29): the closed-loop term alone
  predicted 272 ms where Poisson arrivals measured 1,887 ms; with the waiting term it predicts the
  values in docs/fleet.md, "Capacity planning".
- A fleet of n chips behind prefix-affinity routing splits R evenly, λ = R / n, and keeps each chip under
  ``max_utilisation`` of its largest measured X (headroom for bursts the closed-loop sweep does not show).
  n is the smallest count whose predicted p99 meets the target.
- Each sweep ran through one service process, so one replica sustained one chip's load: replicas = n, and
  at least ``min_replicas`` for availability.
- Behind GKE Inference Gateway (``--gateway``, deploy/k8s/components/gateway) the chips and replicas are the
  same; the fleet adds the endpoint picker's pods, priced from ``eval/capacity/gateway.toml`` (their CPU
  request at a general-purpose node's vCPU-hour price). The Gateway's load balancer itself is billed by
  Google Cloud outside this table and is not included.

Chips without a measured sweep are listed as such, never sized by a guess.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eval.capacity.cost import Price, jev_cost_per_million, load_prices

GATEWAY_COSTS = Path(__file__).with_name("gateway.toml")
DEFAULT_MAX_UTILISATION = 0.8
DEFAULT_MIN_REPLICAS = 2
MAX_CHIPS = 10_000


@dataclass(frozen=True)
class OperatingPoint:
    concurrency: int
    decisions_per_s: float
    p99_ms: float


@dataclass(frozen=True)
class Sweep:
    """One chip's measured load sweep (short states), as `decide eval load` summarises it."""

    chip: str
    points: tuple[OperatingPoint, ...]
    prompt_tokens_median: float | None
    source: str

    @property
    def peak_decisions_per_s(self) -> float:
        return max(point.decisions_per_s for point in self.points)


def read_sweep(run: Path, *, chip: str) -> Sweep:
    """The short-state operating points of a ``decide eval load`` run directory (``summary.json``)."""
    rows = json.loads((run / "summary.json").read_text())
    short = [row for row in rows if row["shape"] == "short"]
    if not short:
        raise ValueError(f"{run}/summary.json has no short-state rows")
    points = tuple(
        sorted(
            (OperatingPoint(r["concurrency"], r["decisions_per_s"], r["p99_ms"]) for r in short),
            key=lambda p: p.concurrency,
        )
    )
    tokens = [r["prompt_tokens_median"] for r in short if r.get("prompt_tokens_median")]
    return Sweep(chip, points, tokens[0] if tokens else None, f"{run}/summary.json")


def closed_loop_p99_ms(sweep: Sweep, rate: float) -> float | None:
    """The measured p99 at the load that carries ``rate`` per chip, interpolated; None above the peak.

    >>> sweep = Sweep("cpu", (OperatingPoint(1, 10.0, 100.0), OperatingPoint(4, 30.0, 200.0)), None, "")
    >>> closed_loop_p99_ms(sweep, 20.0), closed_loop_p99_ms(sweep, 5.0), closed_loop_p99_ms(sweep, 31.0)
    (150.0, 100.0, None)
    """
    # The curve as rate → p99, keeping only points where throughput still rises (past saturation a
    # higher concurrency adds latency, not rate).
    curve: list[OperatingPoint] = []
    for point in sweep.points:
        if not curve or point.decisions_per_s > curve[-1].decisions_per_s:
            curve.append(point)
    if rate > curve[-1].decisions_per_s:
        return None
    if rate <= curve[0].decisions_per_s:
        return curve[0].p99_ms
    for low, high in zip(curve, curve[1:]):
        if rate <= high.decisions_per_s:
            share = (rate - low.decisions_per_s) / (high.decisions_per_s - low.decisions_per_s)
            return low.p99_ms + share * (high.p99_ms - low.p99_ms)
    raise AssertionError("unreachable: rate is within the curve")


def waiting_p99_ms(rate: float, peak: float) -> float | None:
    """p99 of the M/M/1 wait at arrival rate ``rate`` and service rate ``peak``; None at or above it.

    >>> round(waiting_p99_ms(20.0, 40.0), 1), waiting_p99_ms(0.2, 40.0), waiting_p99_ms(40.0, 40.0)
    (195.6, 0.0, None)
    """
    if rate >= peak:
        return None
    busy = rate / peak
    return 0.0 if busy <= 0.01 else math.log(100 * busy) / (peak - rate) * 1000


def predicted_p99_ms(sweep: Sweep, rate: float) -> float | None:
    """p99 at an open rate per chip: the closed-loop p99 at that load plus the M/M/1 wait."""
    serving = closed_loop_p99_ms(sweep, rate)
    waiting = waiting_p99_ms(rate, sweep.peak_decisions_per_s)
    return None if serving is None or waiting is None else serving + waiting


@dataclass(frozen=True)
class Plan:
    chip: str
    chips: int | None
    replicas: int | None
    rate_per_chip: float | None
    predicted_p99_ms: float | None
    note: str
    costs: tuple[tuple[Price, float, float], ...] = ()
    """Per price row of this chip: (row, $/hour for the chips, $/million decisions)."""


def plan_chip(
    sweep: Sweep,
    rate: float,
    p99_ms: float,
    prices: Sequence[Price],
    *,
    max_utilisation: float = DEFAULT_MAX_UTILISATION,
    min_replicas: int = DEFAULT_MIN_REPLICAS,
) -> Plan:
    """The fewest chips of ``sweep.chip`` that carry ``rate`` within ``p99_ms``, and what they cost."""
    check_plan_options(rate, p99_ms, max_utilisation)
    ceiling = sweep.peak_decisions_per_s * max_utilisation
    for chips in range(max(1, math.ceil(rate / ceiling)), MAX_CHIPS + 1):
        per_chip = rate / chips
        p99 = predicted_p99_ms(sweep, per_chip)
        if p99 is not None and p99 <= p99_ms:
            break
        if (
            per_chip <= sweep.points[0].decisions_per_s
        ):  # below the lowest measured load: more chips cannot help
            return Plan(
                sweep.chip,
                None,
                None,
                None,
                None,
                f"even one request at a time measured p99 {sweep.points[0].p99_ms:.0f} ms > {p99_ms:.0f} ms",
            )
    else:
        return Plan(sweep.chip, None, None, None, None, f"more than {MAX_CHIPS} chips")
    costs = tuple(
        (price, price.usd_per_hour * chips, price.usd_per_hour * chips / 3600 / rate * 1e6)
        for price in prices
        if price.chip == sweep.chip
    )
    note = f"at {per_chip:.1f} decisions/s per chip ({per_chip / sweep.peak_decisions_per_s:.0%} of the measured peak)"
    return Plan(sweep.chip, chips, max(chips, min_replicas), per_chip, p99, note, costs)


def check_plan_options(rate: float, p99_ms: float, max_utilisation: float) -> None:
    """The target and the headroom, each in range; ValueError naming the option that is not."""
    if rate <= 0:
        raise ValueError(f"--rate must be above 0 decisions/s, got {rate:g}")
    if p99_ms <= 0:
        raise ValueError(f"--p99 must be above 0 ms, got {p99_ms:g}")
    if not 0 < max_utilisation <= 1:
        raise ValueError(f"--max-utilisation must be in (0, 1], got {max_utilisation:g}")


def read_sweeps(items: Sequence[str]) -> dict[str, Sweep]:
    """``--sweep CHIP=RUN`` items → chip → its sweep; ValueError naming ``--sweep`` for an item that is
    not CHIP=RUN or a run without a readable short-state sweep."""
    sweeps = {}
    for item in items:
        chip, sep, run = item.partition("=")
        if not sep:
            raise ValueError(f"--sweep {item!r} is not CHIP=RUN")
        try:
            sweeps[chip] = read_sweep(Path(run), chip=chip)
        except (OSError, ValueError, KeyError) as error:
            raise ValueError(f"--sweep {item}: {error}") from None
    return sweeps


@dataclass(frozen=True)
class PickerCost:
    """The endpoint picker's pods in a gateway fleet and their price (``eval/capacity/gateway.toml``)."""

    replicas: int
    cpu: float
    memory_gib: float
    usd_per_vcpu_hour: float
    price_name: str

    @property
    def usd_per_hour(self) -> float:
        return self.replicas * self.cpu * self.usd_per_vcpu_hour


def load_picker_cost(path: Path = GATEWAY_COSTS) -> PickerCost:
    data = tomllib.loads(path.read_text())
    picker, price = data["picker"], data["cpu_price"]
    return PickerCost(
        picker["replicas"], picker["cpu"], picker["memory_gib"], price["usd_per_vcpu_hour"], price["name"]
    )


@dataclass(frozen=True)
class FleetPlan:
    """What ``decide plan`` prints: a plan per measured chip, the chips asked for without a sweep, and
    Jev's price at the sweeps' median prompt size."""

    plans: tuple[Plan, ...]
    unmeasured: tuple[str, ...]
    jev: dict
    prompt_tokens: float | None
    picker: PickerCost | None = None
    """Set when planned for the gateway (``--gateway``)."""


def plan_fleet(
    rate: float,
    p99_ms: float,
    *,
    sweeps: Sequence[str] = (),
    chips: Sequence[str] = (),
    prices: Path | None = None,
    max_utilisation: float = DEFAULT_MAX_UTILISATION,
    gateway: bool = False,
) -> FleetPlan:
    """``decide plan``: every chip in ``chips`` or measured by a ``sweeps`` item (CHIP=RUN) planned
    for ``rate`` within ``p99_ms``, priced from ``prices`` (default: the shipped table); with
    ``gateway``, the endpoint picker's pods priced beside them.

    The options are checked before any run is read (ValueError naming the option)."""
    check_plan_options(rate, p99_ms, max_utilisation)
    measured = read_sweeps(sweeps)
    wanted = [name.strip() for name in chips if name.strip()] + [
        chip for chip in measured if chip not in chips
    ]
    price_rows, jev = load_prices(prices)
    plans = tuple(
        plan_chip(measured[chip], rate, p99_ms, price_rows, max_utilisation=max_utilisation)
        for chip in wanted
        if chip in measured
    )
    tokens = next((s.prompt_tokens_median for s in measured.values() if s.prompt_tokens_median), None)
    picker = load_picker_cost() if gateway else None
    return FleetPlan(plans, tuple(c for c in wanted if c not in measured), jev, tokens, picker)


def plan_table(
    plans: Sequence[Plan],
    *,
    rate: float,
    p99_ms: float,
    unmeasured: Sequence[str],
    jev: dict,
    prompt_tokens: float | None,
    picker: PickerCost | None = None,
) -> str:
    """The plan as markdown, with Jev's cost at the same prompts and the chips that have no sweep; with
    ``picker``, each priced row again with the gateway's endpoint picker added."""
    jev_cost = (
        jev_cost_per_million(prompt_tokens, jev["usd_per_million_input_tokens"]) if prompt_tokens else None
    )
    lines = [
        f"Target: {rate:g} decisions/s with p99 ≤ {p99_ms:g} ms.",
        "",
        "| chip | chips | service replicas | predicted p99 ms | price row | $/hour | $/million decisions | vs Jev |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for plan in plans:
        if plan.chips is None:
            lines.append(f"| {plan.chip} | — | — | — | — | — | — | cannot meet the target: {plan.note} |")
            continue
        for price, per_hour, per_million in plan.costs or ((None, None, None),):
            versus = (
                "—"
                if jev_cost is None or per_million is None
                else ("Jev cheaper" if jev_cost < per_million else "chips cheaper")
            )
            lines.append(
                f"| {plan.chip} | {plan.chips} | {plan.replicas} | {plan.predicted_p99_ms:.0f} | {price.name if price else 'no price row'} | "
                + (f"{per_hour:.2f} | {per_million:.2f} | {versus} |" if price else "— | — | — |")
            )
    if picker is not None:
        lines += [
            "",
            f"Behind GKE Inference Gateway: the same chips and service replicas, plus {picker.replicas} endpoint picker "
            f"pod(s) requesting {picker.cpu:g} CPU and {picker.memory_gib:g} GiB each, "
            f"${picker.usd_per_hour:.2f}/hour at {picker.price_name} (the load balancer is billed apart).",
            "",
            "| chip | price row | $/hour with the picker | $/million decisions with the picker |",
            "|---|---|---|---|",
        ]
        priced = [(plan, cost) for plan in plans for cost in plan.costs]
        if not priced:
            lines.append("| — | no priced chip in this plan | — | — |")
        for plan, (price, per_hour, _) in priced:
            with_picker = per_hour + picker.usd_per_hour
            lines.append(
                f"| {plan.chip} | {price.name} | {with_picker:.2f} | {with_picker / 3600 / rate * 1e6:.2f} |"
            )
    if jev_cost is not None:
        lines += ["", f"Jev at {prompt_tokens:.0f} prompt tokens: ${jev_cost:.2f} per million decisions."]
    if unmeasured:
        lines += [
            "",
            f"No measured load sweep, so not sized: {', '.join(unmeasured)} (measure with `decide eval load`, then `--sweep CHIP=RUN`).",
        ]
    return "\n".join(lines) + "\n"
