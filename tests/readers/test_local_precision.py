"""The local engine in bfloat16, an opt-in (``readers.engines.LOCAL_DTYPES``): its answers stay within the
stated bound of float32's on a sample of every shipped task, and are kept apart from float32's by
revision (answers, calibration fits and decision records are keyed by it)."""

from __future__ import annotations

import numpy as np
import pytest

from eval.decisions.tasks import TASKS, spread
from readers.engines import open_engine
from readers.engines.local import LocalEngine
from readers.reader import Reader
from service.protocol import SystemOneRequest

pytestmark = pytest.mark.anyio

PROBABILITY_BOUND = 0.1  # the bound LOCAL_DTYPES states; the measured largest change 0.079, now 0.064


@pytest.fixture(scope="module")
def bfloat16_engine(embedded_model_dir):
    return LocalEngine(embedded_model_dir, dtype="bfloat16")


async def test_bfloat16_reads_stay_within_the_stated_bound_of_float32(local_engine, bfloat16_engine):
    reference, fast = Reader(local_engine), Reader(bfloat16_engine)
    largest = {}
    for name, task in TASKS.items():
        spec = SystemOneRequest.model_validate({"state": "", "questions": {"q": task.question()}})
        question = spec.questions["q"].to_spec()
        gaps = []
        for record in spread(task.records("test"), 4):
            a = (await reference.read(question, record.text)).label_probabilities.probabilities
            b = (await fast.read(question, record.text)).label_probabilities.probabilities
            gaps.append(np.abs(np.asarray(a) - np.asarray(b)).max())
        largest[name] = max(gaps)
    assert max(largest.values()) <= PROBABILITY_BOUND, largest
    # Not float32 under another name: bfloat16 moves the probabilities (1e-4 is float32's own bound).
    assert max(largest.values()) > 1e-4, largest


async def test_a_bfloat16_engine_names_its_precision_in_its_revision(local_engine, bfloat16_engine):
    assert bfloat16_engine.info.revision == f"{local_engine.info.revision}+bfloat16"
    assert "+" not in local_engine.info.revision
    assert bfloat16_engine.capabilities.probe["dtype"] == "bfloat16"
    # and reads with its own attention (readers/engines/attention.py), which the bound above covers
    assert bfloat16_engine.capabilities.probe["attention"] == "opendecide_grouped"


async def test_other_precisions_are_refused_by_name(embedded_model_dir):
    with pytest.raises(ValueError, match="float16"):
        LocalEngine(embedded_model_dir, dtype="float16")
    with pytest.raises(ValueError, match="--dtype"):
        await open_engine("vllm", url="http://127.0.0.1:9", dtype="bfloat16")
