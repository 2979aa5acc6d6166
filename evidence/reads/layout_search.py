"""Layout search (scratch, kept as evidence of how decide-prompt/3 was chosen): layouts x label styles on spread records.
Layouts here omit option descriptions; the shipped decide-prompt/3 adds them on their own lines. Run: PYTHONPATH=. python evidence/reads/layout_search.py 60 oneword:trie,paren_sorted:trie sst2,ag_news,emotion,irony"""
import asyncio, sys, time
import readers.reader as rr
import readers.prompt as rp
from readers.prompt import LabelStyle, PromptText, SYSTEM_PROMPT, STATE_SEPARATOR, _or_list
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from eval.tasks import TASKS, load_sample, spread
ORIG = rp.build_prompt

def make(layout):
    def build(question, state, labels, style):
        if layout == "v2" or question.question_type == "score":
            return ORIG(question, state, labels, style)
        instr = question.instructions or ""
        shown = labels
        if layout.endswith("sorted"):
            shown = tuple(sorted(labels, key=str.lower))
        lines = [f"Question: {instr}"]
        if layout.startswith("oneword"):
            pass
        elif layout.startswith("paren"):
            lines = [f"Question: {instr} ({_or_list(shown)})"]
        elif layout.startswith("list"):
            lines.append("Options: " + ", ".join(shown))
        if question.question_type == "choice" and not style.names_options:
            return ORIG(question, state, labels, style)
        lines.append("Answer with one word.")
        return PromptText(SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(lines), labels, style)
    return build

def spec(task, reversed_options):
    q = task.question(reversed_options=reversed_options)
    opts = tuple(q["criteria"])
    if task.question_type == "noul":
        return rp.QuestionSpec("noul", task.instructions, ("true", "false"), tuple(q["criteria"].values())), opts
    return rp.QuestionSpec("choice", task.instructions, opts, tuple(q["criteria"].values())), opts

async def main():
    n = int(sys.argv[1]); configs = sys.argv[2].split(","); tasks = sys.argv[3].split(",")
    engine = LocalEngine(prepare_embedded_model())
    for config in configs:
        layout, style = config.split(":")
        rr.build_prompt = make(layout)
        styles = {"words": (LabelStyle.WORDS, LabelStyle.CODES), "first": (LabelStyle.WORDS, LabelStyle.FIRST_TOKENS, LabelStyle.CODES), "trie": (LabelStyle.WORDS, LabelStyle.TRIE, LabelStyle.CODES), "codes": (LabelStyle.CODES,)}[style]
        reader = rr.Reader(engine, label_styles=styles)
        res = {}; t0 = time.time()
        for tn in tasks:
            task = TASKS[tn]; recs = spread(load_sample(tn), n)
            preds = {}
            for variant in task.variants:
                q, opts = spec(task, variant == "reversed")
                out = []
                for i in range(0, len(recs), 8):
                    out += await asyncio.gather(*(reader.read(q, r.text) for r in recs[i:i+8]))
                names = opts if task.question_type == "choice" else ("true", "false")
                preds[variant] = [names[max(range(len(names)), key=lambda k: o.label_probabilities.probabilities[k])] for o in out]
                styles_used = {o.label_style.value for o in out}
            gold = [r.gold for r in recs]
            acc = {v: sum(p == g for p, g in zip(ps, gold)) / len(gold) for v, ps in preds.items()}
            ch = sum(a != b for a, b in zip(preds["original"], preds.get("reversed", preds["original"]))) / len(gold)
            res[tn] = f"{'/'.join(f'{a:.2f}' for a in acc.values())} ch={ch:.2f} {','.join(styles_used)}"
        print(config, res, f"{time.time()-t0:.0f}s", flush=True)
    await engine.aclose()
asyncio.run(main())
