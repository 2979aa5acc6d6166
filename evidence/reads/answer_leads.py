"""Which text opens the assistant turn before the answer slot (probe, kept as evidence for docs/reads.md).

Reads the four shipped tasks (original option order) under layouts that are decide-prompt/3's text
with different answer leads ("" is decide-prompt/3 itself, "Answer:" is decide-prompt/4), with the
default label styles, and prints accuracy, how often each option is predicted, and the accuracy after
the state prior (each record's read divided by the mean read of the task's other records,
leave-one-out: what a ``state_prior`` calibration fitted on unlabelled states divides out). Layouts
are ``PromptLayout``s handed to the reader, the way eval reads earlier prompt versions.

Run: PYTHONPATH=. python evidence/reads/answer_leads.py 300 > evidence/reads/answer-leads-300.txt
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np

from calibration.fit import gold_index
from eval.tasks import TASKS, load_sample, spread
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from readers.prompt import PromptLayout, build_prompt
from readers.reader import Reader
from service.protocol import SystemOneRequest

LEADS = ("", "Answer:", "Final answer:")


async def main(n: int) -> None:
    engine = LocalEngine(prepare_embedded_model())
    try:
        print(f"{n} spread records per task, original option order; embedded {engine.info.name} @ {engine.info.revision}, exact reads")
        print("| answer lead | task | accuracy | with the state prior (leave-one-out) | predicted per option | label style |")
        print("|---|---|---|---|---|---|")
        for lead in LEADS:
            reader = Reader(engine, layout=PromptLayout(f"probe: lead {lead!r}", build_prompt, answer_lead=lead))
            for name, task in TASKS.items():
                records = spread(load_sample(name), n)
                spec = SystemOneRequest.model_validate({"state": "", "questions": {"q": task.question()}}).questions["q"].to_spec()
                gold = np.array([gold_index(spec.question_type, spec.options, record.gold) for record in records])
                readings = await asyncio.gather(*(reader.read(spec, record.text) for record in records))
                p = np.array([r.label_probabilities.probabilities for r in readings])
                others = (p.sum(axis=0) - p) / (len(p) - 1)
                counts = np.bincount(p.argmax(axis=1), minlength=len(spec.options)).tolist()
                styles = sorted({str(r.label_style) for r in readings})
                print(f"| {lead!r} | {name} | {np.mean(p.argmax(axis=1) == gold):.1%} | {np.mean((p / others).argmax(axis=1) == gold):.1%} | {counts} | {', '.join(styles)} |", flush=True)
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
