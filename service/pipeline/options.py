"""Command-line options that ``decide serve``/``ask`` (service/cli.py), ``decide eval`` (eval/cli.py) and
``decide engine`` (deploy/cli.py) share, declared once.

They live here, in the pipeline, because it is the lowest layer every command module may import:
eval imports from service only the pipeline and the wire models (tests/test_layers.py), and the prior
correction option names the pipeline's ``PriorCorrection``. Nothing here imports a model library or a
web framework, so ``decide --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from readers.engines import DEFAULT_VLLM_TOP_K, LOCAL_DTYPES
from service.pipeline.prior import PriorCorrection


def quiet_loaders() -> None:
    """Silence the model loaders' progress bars: commands print answers, not loading noise.

    Called by each command that loads a model, never at import, so ``decide --help`` stays fast."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


EngineOption = Annotated[str, typer.Option("--engine", help="local (embedded model, in process) or vllm")]
EngineUrlOption = Annotated[
    str | None, typer.Option("--engine-url", help="vLLM server URL, for --engine vllm")
]
TopKOption = Annotated[
    int | None,
    typer.Option(
        "--top-k",
        help=f"read only the top-k log-probs (local: emulate a top-k engine; vllm: default {DEFAULT_VLLM_TOP_K})",
    ),
]
DtypeOption = Annotated[
    str,
    typer.Option(
        "--dtype",
        help=f"local engine: compute in {' or '.join(LOCAL_DTYPES)}; bfloat16 is faster where the CPU has bf16 "
        "units, its probabilities within 0.1 of float32's, its answers and calibrations kept apart (docs/shared-state.md)",
    ),
]
ModelDirOption = Annotated[
    Path | None,
    typer.Option("--model-dir", help="a Hugging Face model folder (default: the embedded SmolLM2)"),
]
PriorCorrectionOption = Annotated[
    PriorCorrection,
    typer.Option(
        "--prior-correction",
        help="which questions' reads get their option prior (read on content-free states) divided out, where no stored calibration applies: "
        "the question types, joined by + (e.g. choice+score), all, or off (raw reads); docs/reads.md says which the default covers and why",
    ),
]
TokenizerOption = Annotated[
    str | None, typer.Option("--tokenizer", help="tokenizer folder or hub id of the vLLM-served model")
]
# Which model the local engine runs: --model picks an embedded one, --model-dir any folder, and
# --chat-template replaces its tokenizer's template (as vLLM's option of that name).
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="an embedded model, prepared on first use: smollm2-135m-instruct (default) or gemma3-270m "
        "(docs/models.md); with --engine vllm, the tokenizer of the model the server serves",
    ),
]
ChatTemplateOption = Annotated[
    Path | None,
    typer.Option(
        "--chat-template",
        help="a jinja chat template file replacing the model's own (needed for a model without one)",
        dir_okay=False,
    ),
]
