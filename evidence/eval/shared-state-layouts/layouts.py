"""Quick paired accuracy of candidate layouts on a spread of SST-2 and AG News records (whole prompts, exact)."""
import sys, json, time
import readers.reader as rr
import readers.prompt as rp
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from service.protocol import SystemOneRequest
from eval.tasks import TASKS, load_sample, spread, requests_for

orig = rp.build_prompt
def layout(name):
    def build(question, state, labels, style):
        p = orig(question, state, labels, style)
        q = p.question
        if name == "A":   # current
            return p
        if name == "old":  # decide-prompt/1
            return rp.PromptText(q, "", state, labels, style)
        if name == "B":   # state in system, question as user
            return rp.PromptText("Text:\n" + state, "", q, labels, style)
        if name == "C":   # labelled state then question in user
            return rp.PromptText(rp.SYSTEM_PROMPT, "Text: " + state + "\n\n", q, labels, style)
        if name == "D":   # generic system; user: text, then question; question repeated format
            return rp.PromptText("You answer questions about a text. Reply with one word.", "Text:\n" + state + "\n\n", q, labels, style)
        if name == "N":  # two user turns: state, then question
            return rp.PromptText(rp.SYSTEM_PROMPT, state, q, labels, style)
        if name == "N2":  # two user turns, system mentions a text then a question
            return rp.PromptText("The user sends a text, then a question about it. Answer the question.", state, q, labels, style)
        if name == "R":
            return rp.PromptText(rp.SYSTEM_PROMPT, state + "\n\n", q + "\nAnswer:", labels, style)
        if name == "S":
            return rp.PromptText(rp.SYSTEM_PROMPT, 'Text: "' + state + '"\n\n', "About the text above. " + q, labels, style)
        if name == "E":   # state as system, no header
            return rp.PromptText(state, "", q, labels, style)
    return build

import readers.labels as rl
_render = rl.ChatTemplate._render
def render(self, system, user, answer):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    if SPLIT[0] and "\ue000question" in user:
        at = user.index("\ue000question")
        messages[1:2] = [{"role": "user", "content": user[:at]}, {"role": "user", "content": user[at:]}]
    with self._lock:
        return self.tokenizer.apply_chat_template(messages, tokenize=False)
rl.ChatTemplate._render = render
SPLIT = [False]
engine = LocalEngine(prepare_embedded_model())
n = int(sys.argv[1]); names = sys.argv[2].split(","); tasks = sys.argv[3].split(",")
for name in names:
    rr.build_prompt = layout(name)
    SPLIT[0] = name.startswith("N")
    reader = rr.Reader(engine)
    out = {}
    for task_name in tasks:
        task = TASKS[task_name]
        records = spread(load_sample(task_name), n)
        for variant in task.variants:
            prompts, labels, golds, opts = [], [], [], []
            for record, body in requests_for(task, records, variant):
                spec = SystemOneRequest.model_validate(body).questions["answer"].to_spec()
                req = SystemOneRequest.model_validate(body)
                slot, _ = reader.prepare(spec, req.state_text())
                prompts.append(slot.prompt_ids); labels.append(slot.label_ids); golds.append(record.gold); opts.append(spec.options)
            rows = []
            for i in range(0, len(prompts), 8):
                rows += engine.batch_logprobs(prompts[i:i+8], [0]*len(prompts[i:i+8]))
            correct = 0
            for row, lab, gold, op in zip(rows, labels, golds, opts):
                best = max(range(len(lab)), key=lambda j: float(row[lab[j]]))
                q_ = None
                correct += (op[best] == gold) if task.question()["type"] != "noul" else (op[best] == gold)
            out[f"{task_name}/{variant}"] = round(correct / len(rows), 3)
            if name.startswith("N") and task_name == "sst2" and variant == "original": print(engine.tokenizer.decode(prompts[0]))
    print(name, out, flush=True)
