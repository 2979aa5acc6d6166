"""The two embedded models side by side on the same test records (100 spread per task): default reads."""
from collections import Counter
from pathlib import Path
import statistics
from eval.evidence import load_rows
from eval.score import wilson_interval
from eval.tasks import TASKS

def rows(run):
    return {(r["task"], r["id"]): r for r in load_rows(Path(run), timings=True) if r["status"] == "ok" and r["variant"] == "original"}

gemma = rows("evidence/reads/regression-gemma/baseline")
smol = rows("evidence/reads/regression/candidate")
keys = sorted(gemma)
print("| task | type | n | majority | SmolLM2-135M-Instruct (95% CI) | Gemma 3 270M (95% CI) | median ms SmolLM2 / Gemma |")
print("|---|---|---|---|---|---|---|")
lifts = {"smol": {}, "gemma": {}}
for task in TASKS:
    mine = [k for k in keys if k[0] == task]
    n = len(mine)
    majority = Counter(gemma[k]["gold"] for k in mine).most_common(1)[0][1] / n
    cells = []
    for name, side in (("smol", smol), ("gemma", gemma)):
        right = sum(side[k]["predicted"] == side[k]["gold"] for k in mine)
        lo, hi = wilson_interval(right, n)
        cells.append(f"{right / n:.1%} ({lo:.1%}–{hi:.1%})")
        lifts[name].setdefault(TASKS[task].question_type, []).append(right / n - majority)
    ms = [statistics.median(side[k]["latency_ms"] for k in mine) for side in (smol, gemma)]
    print(f"| {task} | {TASKS[task].question_type} | {n} | {majority:.1%} | {cells[0]} | {cells[1]} | {ms[0]:.0f} / {ms[1]:.0f} |")
for name in lifts:
    per_type = {t: sum(v) / len(v) for t, v in lifts[name].items()}
    print(name, {t: f"{v:+.1%}" for t, v in per_type.items()}, f"mean over types {sum(per_type.values()) / 3:+.1%}")
