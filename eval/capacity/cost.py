"""Cost per million decisions from measured throughput, for each price row (``decide cost``).

    cost per million decisions = $/h ÷ 3600 ÷ (decisions/s × utilisation) × 10⁶

``utilisation`` is the share of billed time the chip spends deciding (1.0: busy all the time it is
billed; 0.25: billed around the clock, busy a quarter of it). Jev bills input tokens only, so its
cost per million decisions is the median prompt tokens × its price per million tokens.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from eval.evidence.rows import RECORDS, load_rows


@dataclass(frozen=True)
class Price:
    name: str
    chip: str
    usd_per_hour: float
    billing: str
    source: str
    date: str


@dataclass(frozen=True)
class Throughput:
    """Decisions/s measured (or quoted, with its source) for one model on one chip."""

    label: str
    chip: str
    decisions_per_s: float
    prompt_tokens_median: float | None
    source: str


def load_prices(
    path: Path | None = None, overrides: dict[str, tuple[str, float]] | None = None
) -> tuple[list[Price], dict]:
    """Price rows and Jev's price: the shipped file (or ``path``), plus ``overrides`` name → (chip, $/h)."""
    text = path.read_text() if path else resources.files("eval.data").joinpath("prices.toml").read_text()
    data = tomllib.loads(text)
    prices = [Price(**row) for row in data["price"]]
    for name, (chip, usd) in (overrides or {}).items():
        prices = [p for p in prices if p.name != name] + [
            Price(name, chip, usd, "user", "given on the command line", "")
        ]
    if free := [p.name for p in prices if not p.usd_per_hour > 0]:
        raise ValueError(f"price rows must be above 0 $/h: {', '.join(free)}")
    return prices, data["jev"]


def price_overrides(items: list[str], *, chip: str) -> dict[str, tuple[str, float]]:
    """``NAME=USD_PER_HOUR`` items (``--price``) as ``load_prices`` overrides for ``chip``.

    >>> price_overrides(["cpu-2core=0.36"], chip="cpu")
    {'cpu-2core': ('cpu', 0.36)}
    """
    overrides = {}
    for item in items:
        name, sep, usd = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            overrides[name] = (chip, float(usd))
        except ValueError:
            raise ValueError(f"{item!r} is not NAME=USD_PER_HOUR") from None
    return overrides


def write_cost(out: Path, rows: list[dict], break_even: list[dict]) -> None:
    """cost.json (costs and break-even rows) and cost.png in ``out``."""
    from eval.evidence.figures import plot_costs

    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(json.dumps({"costs": rows, "break_even": break_even}, indent=2) + "\n")
    plot_costs(rows, out / "cost.png")


def cost_per_million(usd_per_hour: float, decisions_per_s: float, utilisation: float = 1.0) -> float:
    """
    >>> round(cost_per_million(2.97, 274), 2)
    3.01
    """
    check_utilisation(utilisation)
    if decisions_per_s <= 0:
        raise ValueError(f"decisions/s must be positive, got {decisions_per_s:g}")
    return usd_per_hour / 3600 / (decisions_per_s * utilisation) * 1e6


def jev_cost_per_million(prompt_tokens: float, usd_per_million_tokens: float) -> float:
    """
    >>> round(jev_cost_per_million(132, 0.042), 2)
    5.54
    """
    return prompt_tokens * usd_per_million_tokens


# what throughput_of_run reads from a run directory
MEASUREMENT_FILES = ("summary.json", "load.jsonl", "latency.json", RECORDS)


def run_chips(manifest: dict) -> tuple[set[str], str] | None:
    """The chips a run's manifest shows it could have been measured on, and why; None when it does not say.

    In order: a ``chip`` field; the embedded (``local``) engine, which reads in process on the host
    CPU; the device word of the server's "KV cache size" line and the TPU-only "Memory statistics"
    line recorded from ``--engine-log`` (the same evidence ``decide survey --measured`` checks).
    """
    from eval.capacity.survey import CHIPS, LOG_DEVICE_CHIPS, TPU_CHIPS

    if manifest.get("chip") in CHIPS:
        return {manifest["chip"]}, f"its manifest names chip {manifest['chip']}"
    if ((manifest.get("engines") or {}).get("run") or {}).get("kind") == "local":
        return {"cpu"}, "the local engine read in process on the host CPU"
    device = (manifest.get("kv_capacity") or {}).get("device")
    if device in LOG_DEVICE_CHIPS:
        return set(LOG_DEVICE_CHIPS[device]), f"its server log's KV line is from a {device} server"
    if manifest.get("memory_statistics"):
        return set(TPU_CHIPS), "its server log has the TPU memory line"
    return None


def throughput_of_run(run: Path, *, label: str, chip: str, concurrency: int = 8) -> Throughput:
    """Decisions/s at ``concurrency`` from a load sweep (``summary.json``, else ``load.jsonl``, short
    states) or an eval run's ``latency.json``, and the median prompt tokens.

    In a run downloaded by ``decide eval download`` (its manifest lists its files) the files read
    here are first checked against that list (others, such as a later ``decide eval score``'s
    output, may change). A run whose manifest shows another chip than ``chip`` is refused. Raises
    ValueError, naming the file, for a run it cannot read.
    """
    from eval.evidence.storage import verify_run

    manifest = json.loads((run / "manifest.json").read_text()) if (run / "manifest.json").is_file() else {}
    if manifest:
        verify_run(run, only=MEASUREMENT_FILES)
    if (measured := run_chips(manifest)) and chip not in measured[0]:
        raise ValueError(
            f"{run} was measured on {' or '.join(sorted(measured[0]))} ({measured[1]}), not --chip {chip}"
        )
    machine = (manifest.get("machine") or {}).get("cpu", "")
    if (run / "summary.json").is_file() or (run / "load.jsonl").is_file():
        if (run / "summary.json").is_file():
            source, summary = "summary.json", json.loads((run / "summary.json").read_text())
        else:  # `decide eval load` writes summary.json after the sweep; a sweep run through the library has only load.jsonl
            from eval.capacity.sweep import summarise

            source, summary = (
                "load.jsonl",
                summarise(
                    [
                        json.loads(line)
                        for line in (run / "load.jsonl").read_text().splitlines()
                        if line.strip()
                    ]
                ),
            )
        rows = [r for r in summary if r["shape"] == "short" and r["concurrency"] == concurrency]
        if not rows:
            raise ValueError(f"{run}/{source} has no short-state run at concurrency {concurrency}")
        return Throughput(
            label,
            chip,
            rows[0]["decisions_per_s"],
            rows[0]["prompt_tokens_median"],
            f"{run}/{source} ({machine})",
        )
    if not (run / "latency.json").is_file():
        raise ValueError(
            f"{run} has no summary.json or load.jsonl (decide eval load) and no latency.json (decide eval tasks --latency)"
        )
    latency = json.loads((run / "latency.json").read_text())
    key = f"c{concurrency}"
    if key not in latency:
        raise ValueError(f"{run}/latency.json has no concurrency-{concurrency} measurement")
    tokens = []
    if (run / RECORDS).is_file():
        rows = load_rows(run / RECORDS)
        tokens = [row["reading"]["prompt_tokens"] for row in rows if row.get("status") == "ok"]
    return Throughput(
        label,
        chip,
        latency[key]["decisions_per_s"],
        statistics.median(tokens) if tokens else None,
        f"{run}/latency.json ({latency['machine']['cpu']})",
    )


def quoted_v6e_throughputs() -> list[Throughput]:
    """The reference study's published v6e decisions/s (quoted, with their source)."""
    data = tomllib.loads(resources.files("eval.data.reference").joinpath("v6e-throughput.toml").read_text())
    return [
        Throughput(
            f"{row['label']} (quoted)",
            "v6e",
            row["decisions_per_s"],
            data["prompt_tokens_median"],
            data["source"],
        )
        for row in data["rate"]
    ]


def check_utilisation(utilisation: float) -> None:
    """``--utilisation``, the share of billed time spent deciding, is in (0, 1]."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"--utilisation must be in (0, 1], got {utilisation:g}")


def cost_rows(
    throughputs: list[Throughput], prices: list[Price], jev: dict, *, utilisation: float = 1.0
) -> list[dict]:
    """One row per (throughput, price on the same chip), then Jev at each distinct median prompt size.
    ValueError naming ``--utilisation`` unless it is in (0, 1]."""
    check_utilisation(utilisation)
    rows = []
    for t in throughputs:
        for p in prices:
            if p.chip == t.chip:
                rows.append({"label": t.label, "price": p.name, "usd_per_hour": p.usd_per_hour, "decisions_per_s": t.decisions_per_s,
                             "utilisation": utilisation, "usd_per_million": cost_per_million(p.usd_per_hour, t.decisions_per_s, utilisation),
                             "throughput_source": t.source, "price_source": p.source})  # fmt: skip
    seen = set()
    for t in throughputs:
        if t.prompt_tokens_median and t.prompt_tokens_median not in seen:
            seen.add(t.prompt_tokens_median)
            rows.append({"label": f"Jev at {t.label}'s prompt size", "price": jev["name"], "prompt_tokens": t.prompt_tokens_median,
                         "usd_per_million": jev_cost_per_million(t.prompt_tokens_median, jev["usd_per_million_input_tokens"]),
                         "price_source": jev["source"]})  # fmt: skip
    return rows


def break_even_rows(rows: list[dict], prices: list[Price], *, utilisation: float = 1.0) -> list[dict]:
    """For price rows on chips with no throughput in ``rows``: the decisions/s each must sustain to
    match the cheapest costed row of the same billing (on-demand with on-demand, spot with spot;
    the cheapest of all where that billing has none), so an unmeasured chip is judged, not costed."""
    check_utilisation(utilisation)
    billing = {p.name: p.billing for p in prices}
    costed = [r for r in rows if "usd_per_hour" in r]
    measured_chips = {p.chip for p in prices if any(r["price"] == p.name for r in costed)}
    out = []
    for p in prices:
        if not costed or p.chip in measured_chips:
            continue
        alike = [r for r in costed if billing.get(r["price"]) == p.billing] or costed
        match = min(alike, key=lambda r: r["usd_per_million"])
        out.append({"price": p.name, "chip": p.chip, "billing": p.billing, "usd_per_hour": p.usd_per_hour, "utilisation": utilisation,
                    "match": f"{match['label']} on {match['price']} ({billing.get(match['price'])})", "match_usd_per_million": match["usd_per_million"],
                    "decisions_per_s_needed": p.usd_per_hour / 3600 / (match["usd_per_million"] / 1e6) / utilisation,
                    "price_source": p.source})  # fmt: skip
    return out


def break_even_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = [
        "Price rows with no throughput here: the decisions/s each needs to match the cheapest costed row of its billing "
        "(of any billing where none of its own is costed):",
        "",
        "| price row | chip | billing | $/h | utilisation | decisions/s needed | to match |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['price']} | {r['chip']} | {r['billing']} | {r['usd_per_hour']:.4g} | {r['utilisation']:.0%} | {r['decisions_per_s_needed']:.1f} | "
        f"{r['match']} (${r['match_usd_per_million']:.2f}/M) |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def cost_table(rows: list[dict]) -> str:
    lines = [
        "| throughput | price row | $/h | decisions/s | utilisation | $ per million decisions |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "usd_per_hour" in r:
            lines.append(
                f"| {r['label']} | {r['price']} | {r['usd_per_hour']:.4g} | {r['decisions_per_s']:.1f} | {r['utilisation']:.0%} | {r['usd_per_million']:.2f} |"
            )
        else:
            lines.append(
                f"| {r['label']} | {r['price']} ({r['prompt_tokens']:.0f} input tokens) | — | — | — | {r['usd_per_million']:.2f} |"
            )
    return "\n".join(lines) + "\n"
