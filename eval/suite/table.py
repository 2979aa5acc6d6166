"""The suite's scorecard as markdown (``suite.md``, and what ``decide eval suite`` prints)."""

from __future__ import annotations


def _ci(interval: list[float] | None, *, percent: bool = False) -> str:
    """A 95% range as text: percentages to 0.1 points, other figures to 3 decimals ("to" when signed)."""
    if interval is None:
        return "—"
    lo, hi = interval
    if percent:
        return f"{lo:.1%}–{hi:.1%}"
    return f"{lo:.3f} to {hi:.3f}" if lo < 0 else f"{lo:.3f}–{hi:.3f}"


def _value(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def suite_table(report: dict) -> str:
    """The scorecard as markdown: groups, subsets, score subsets, distribution subsets, checksums."""

    def jev_cells(entry: dict) -> str:
        if "jev_accuracy" not in entry:
            return "— | — | —"
        lo, hi = entry["jev_minus_arm_ci95"]
        return f"{entry['jev_accuracy']:.1%} | {entry['jev_macro_accuracy']:.1%} | {entry['jev_minus_arm'] * 100:+.1f} ({lo * 100:+.1f} to {hi * 100:+.1f})"

    boot = report["bootstrap"]
    lines = [
        (
            f"Pooled accuracy is over records (Wilson 95% range, and the family-clustered bootstrap range); macro is the mean of subset "
            f"accuracies. Bootstrap: {boot['resamples']} resamples of families within each subset, seed {boot['seed']}. "
            f"Jev minus arm is pooled and unpaired (two-proportion normal interval); ECE over {report['n_bins']} bins."
        ),
        "",
        "| questions | subsets | records | pooled accuracy (Wilson 95%) | family 95% | macro accuracy (family 95%) | Jev pooled | Jev macro | Jev minus arm, points (95% range) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in [("all", report["overall"]), *report["question_types"].items()]:
        lo, hi = entry["accuracy_ci95"]
        lines.append(
            f"| {name} | {entry['subsets']} | {entry['n']} | {entry['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | {_ci(entry['accuracy_family_ci95'], percent=True)} | "
            f"{entry['macro_accuracy']:.1%} ({_ci(entry['macro_accuracy_family_ci95'], percent=True)}) | {jev_cells(entry)} |"
        )  # fmt: skip
    lines += [
        "", "| subset | question type | n | families (complete) | accuracy (Wilson 95%) | family 95% | ECE | ECE after 50 gold answers | Brier | Jev accuracy / ECE / Brier | checksum |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, s in report["subsets"].items():
        lo, hi = s["accuracy_ci95"]
        jev = (
            f"{s['jev_accuracy']:.1%} / {s['jev_ece']:.3f} / {s['jev_brier']:.3f}"
            if "jev_accuracy" in s
            else "—"
        )
        lines.append(
            f"| {name} | {s['question_type']} | {s['n']} | {s['families']} ({s['families_complete']}) | {s['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | "
            f"{_ci(s['accuracy_family_ci95'], percent=True)} | {s['ece']:.3f} | {_value(s.get('ece_after_50'))} | {s['brier']:.3f} | {jev} | {s.get('checksum', '—')} |"
        )  # fmt: skip
    scored = {name: s for name, s in report["subsets"].items() if "mae" in s}
    if scored:
        lines += ["", "Score subsets: expected level (Σ k·p_k) against the gold level.", "",
                  "| subset | n | MAE, levels (family 95%) | Spearman (family 95%) |", "|---|---|---|---|"]  # fmt: skip
        for name, s in scored.items():
            lines.append(
                f"| {name} | {s['n']} | {s['mae']:.3f} ({_ci(s['mae_family_ci95'])}) | {_value(s['spearman'])} ({_ci(s['spearman_family_ci95'])}) |"
            )
    spread = {name: s for name, s in report["subsets"].items() if "js_divergence_bits" in s}
    if spread:
        lines += ["", "Distribution subsets: the model's probabilities against the human label distribution, mean over records.", "",
                  "| subset | n | Jensen–Shannon divergence, bits (family 95%) | total variation (family 95%) |", "|---|---|---|---|"]  # fmt: skip
        for name, s in spread.items():
            lines.append(
                f"| {name} | {s['n']} | {_value(s['js_divergence_bits'])} ({_ci(s['js_divergence_bits_family_ci95'])}) | "
                f"{_value(s['total_variation'])} ({_ci(s['total_variation_family_ci95'])}) |"
            )  # fmt: skip
    after = report["median_ece_after_50"]
    lines.append(
        f"\nMedian over subsets: ECE {report['median_ece']:.3f}, after 50 gold answers {'—' if after is None else f'{after:.3f}'}, "
        f"Brier {report['median_brier']:.3f} (Jev 1.13.0 published: ECE 0.071, Brier 0.267). Unreadable records: {report['errors']}."
    )  # fmt: skip
    if report["checksums"]:
        counts = {
            status: sum(c["status"] == status for c in report["checksums"].values())
            for status in ("verified", "mismatch", "unknown")
        }
        lines.append(
            f"Checksums against the published dataset_sha256: {counts['verified']} verified, {counts['mismatch']} mismatch, {counts['unknown']} unknown (none published)."
        )
    return "\n".join(lines) + "\n"
