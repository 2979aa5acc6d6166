"""Helpers the reader tests share, and tests elsewhere import (a plain module: no test imports another).

- ``distinct_tokens``: the nodes of a batch's token trie, what the engines compute once.
- ``folder_without_template``: a prepared model folder whose tokenizer has no chat template.
- ``completion_reply``: a vLLM ``/v1/completions`` reply for a body the ``vllm`` engine sends, the
  answers of the stand-in vLLM servers (``tests/readers/test_routing.py``'s in-process ``FakeServer``
  and ``tests/integration/standin_vllm.py``'s loopback one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from readers.embedded import MANIFEST


def distinct_tokens(prompts) -> int:
    """The nodes of the token trie of ``prompts``."""
    return len({tuple(ids[: n + 1]) for ids in prompts for n in range(len(ids))})


def folder_without_template(source: Path, target: Path) -> Path:
    """``source``'s model with a tokenizer that has no chat template (weights linked, not copied)."""
    target.mkdir()
    for path in source.iterdir():
        if path.name == "chat_template.jinja":
            continue
        if path.name == "tokenizer_config.json":
            config = json.loads(path.read_text())
            config.pop("chat_template", None)
            (target / path.name).write_text(json.dumps(config))
        elif path.name != MANIFEST:
            (target / path.name).symlink_to(path)
    return target


def completion_reply(body: dict[str, Any], *, exact: bool = True, masked_first_ids=None) -> dict[str, Any]:
    """The reply to a ``/v1/completions`` body: ``logprobs`` made-up top tokens (1000, 1001, …); with
    ``logprob_token_ids`` and ``exact``, those ids' log-probs too (vLLM's exact reads); with
    ``structured_outputs`` and ``masked_first_ids`` (choice text → its first token id), the choices'
    first tokens only (a masked read). ``usage`` counts the prompt ids."""
    top = {1000 + i: -0.5 - i for i in range(body["logprobs"])}
    if "logprob_token_ids" in body and exact:
        top = {1000: -0.5, **{t: -3.0 - i for i, t in enumerate(body["logprob_token_ids"])}}
    elif "structured_outputs" in body and masked_first_ids is not None:
        top = {masked_first_ids(choice): -0.7 for choice in body["structured_outputs"]["choice"]}
    return {
        "choices": [
            {"text": "x", "logprobs": {"top_logprobs": [{f"token_id:{k}": v for k, v in top.items()}]}}
        ],
        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1},
    }
