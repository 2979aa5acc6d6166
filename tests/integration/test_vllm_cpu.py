"""Decisions through a real vLLM-CPU engine, in each read mode, against the embedded model's exact reads.

Both engines read the same bf16 weights computed in float32, so exact and masked reads must agree
with the in-process model; top-k + floor may disagree only where labels fell outside the top-k.
"""

from __future__ import annotations

import pytest

from bench.latency_costs import ReadRecordingEngine, token_counts
from bench.latency_shapes import Bodies
from eval.decisions.agree import agreement
from eval.decisions.tasks import TASKS, load_sample, spread
from eval.evidence.rows import read_rows
from readers.engines.base import ReadMode, ReadRequest
from readers.engines.vllm import VLLMEngine
from readers.prompt import CURRENT_LAYOUT, DEFAULT_LABEL_STYLES, MASKED_LABEL_STYLES, masked_score_styles
from readers.reader import Reader

pytestmark = pytest.mark.anyio

RECORDS_PER_TASK = 25  # 100 records, 175 reads with the reversed variants


async def read_all(reader: Reader) -> dict[str, list]:
    reads = {}
    for name, task in TASKS.items():
        records = spread(load_sample(name), RECORDS_PER_TASK)
        reads[name] = []
        for variant in task.variants:
            reads[name] += await read_rows(
                reader, [task.read_job(record, variant) for record in records], concurrency=4
            )
    return reads


@pytest.fixture(scope="module")
async def embedded_reads(local_engine):
    """In-process exact reads with each engine's default label styles (masked engines read first
    tokens where the others read whole names: readers/prompt.py MASKED_LABEL_STYLES and
    masked_score_styles)."""
    return {
        ReadMode.EXACT: await read_all(Reader(local_engine, label_styles=DEFAULT_LABEL_STYLES)),
        ReadMode.MASKED: await read_all(
            Reader(
                local_engine,
                label_styles=MASKED_LABEL_STYLES,
                score_label_styles=masked_score_styles(CURRENT_LAYOUT.score_label_styles),
            )
        ),
    }


async def test_probe_finds_every_mode_and_the_logprob_cap(vllm_url):
    engine = await VLLMEngine.connect(vllm_url, top_k=64)
    try:
        capabilities = engine.capabilities
        assert capabilities.probe["supports"] == {
            "exact": True,
            "masked": True,
            "topk": True,
            "images": False,
        }
        assert capabilities.read_mode is ReadMode.EXACT
        assert capabilities.max_logprobs == 32 and capabilities.top_k == 32  # the server's --max-logprobs
        assert "max allowed: 32" in capabilities.probe["topk_refused"]
        assert engine.info.revision.startswith("gguf-sha256:") and engine.info.context_length == 8192
    finally:
        await engine.aclose()


@pytest.mark.parametrize("mode", [ReadMode.EXACT, ReadMode.MASKED])
async def test_exact_and_masked_reads_agree_with_the_embedded_model(vllm_url, embedded_reads, mode):
    engine = await VLLMEngine.connect(vllm_url, read_mode=mode)
    try:
        served = await read_all(Reader(engine))
    finally:
        await engine.aclose()
    rows = [agreement(name, embedded_reads[mode][name], served[name]) for name in TASKS]
    total = sum(row.n for row in rows)
    same = sum(row.same_label for row in rows)
    worst = max(row.max_abs_dp for row in rows)
    assert total >= 100
    assert same >= 0.99 * total, [row.differing for row in rows]
    assert worst < 1e-3, f"max |dp| {worst:.2e}"
    for reads in served.values():
        assert all(read["reading"]["read_mode"] == mode.value and read["reading"]["exact"] for read in reads)
        if mode is ReadMode.MASKED:
            assert all(read["reading"]["label_mass"] is None for read in reads)


async def test_top_k_disagreements_only_where_labels_were_missing(vllm_url, embedded_reads):
    engine = await VLLMEngine.connect(vllm_url, read_mode=ReadMode.TOPK, top_k=3)
    try:
        served = await read_all(Reader(engine))
    finally:
        await engine.aclose()
    missing = sum(
        read["reading"]["labels_returned"] < read["reading"]["labels_total"]
        for reads in served.values()
        for read in reads
    )
    assert missing > 0, "top-3 should miss labels on some records"
    for name in TASKS:
        row = agreement(name, embedded_reads[ReadMode.EXACT][name], served[name])
        assert all(case["b_missing_labels"] > 0 for case in row.differing), row.differing
        for read_b in served[name]:
            if read_b["reading"]["exact"]:
                twin = next(
                    r
                    for r in embedded_reads[ReadMode.EXACT][name]
                    if (r["id"], r["variant"]) == (read_b["id"], read_b["variant"])
                )
                assert read_b["probabilities"] == pytest.approx(twin["probabilities"], abs=1e-3)


async def test_the_service_fronts_vllm_in_each_mode(vllm_url, client_factory):
    body = {
        "state": "The update bricked my phone and support hung up on me.",
        "questions": {
            "angry": {"type": "noul", "instructions": "Is the customer angry?"},
            "topic": {"type": "choice", "criteria": {"billing": None, "hardware": None, "software": None}},
            "urgency": {
                "type": "score",
                "instructions": "How urgent?",
                "criteria": ["low", "medium", "high"],
            },
        },
    }
    answers = {}
    for mode in ReadMode:
        engine = await VLLMEngine.connect(vllm_url, read_mode=mode)
        try:
            async with client_factory(engine) as client:
                response = await client.post("/v1/systemone", json=body)
                models = (await client.get("/v1/models")).json()["models"][0]
        finally:
            await engine.aclose()
        assert response.status_code == 200, response.text
        payload = response.json()
        assert (
            payload["x_provenance"]["engine"] == "vllm" and payload["x_provenance"]["read_mode"] == mode.value
        )
        assert models["read_mode"] == mode.value and models["max_logprobs"] == 32
        answers[mode] = payload["answers"]
    exact, masked = answers[ReadMode.EXACT], answers[ReadMode.MASKED]
    assert masked["angry"]["noul"] == pytest.approx(exact["angry"]["noul"], abs=1e-4)
    assert masked["urgency"]["score"] == pytest.approx(exact["urgency"]["score"], abs=1e-4)


async def test_a_prompt_read_again_reports_the_tokens_the_prefix_cache_served(vllm_server, tokenizer):
    server, spec = vllm_server
    engine = await VLLMEngine.connect(server.url)
    # Its own text, so no earlier test cached it; long enough for several whole KV blocks.
    text = "A prompt read twice to see the prefix cache at work. " * 8
    prompt = tuple(tokenizer.encode(text, add_special_tokens=False))
    request = ReadRequest(prompt, (28, 29), ("A", "B"))
    try:
        first = await engine.read(request)
        again = await engine.read(request)
    finally:
        await engine.aclose()
    block = spec.block_size
    assert first.cached_tokens == 0 and first.computed_tokens == len(prompt)
    # Whole blocks only, and never the last prompt token (vLLM computes it to sample).
    assert again.cached_tokens == (len(prompt) - 1) // block * block > 0
    assert again.computed_tokens + again.cached_tokens == len(prompt)
    assert [again.logprobs[t] for t in (28, 29)] == pytest.approx(
        [first.logprobs[t] for t in (28, 29)], abs=1e-4
    )


async def test_every_vllm_metric_in_the_dashboard_is_scraped(vllm_url):
    import httpx

    from tests.dashboard import dashboard_metric_names, scraped_sample_names

    async with httpx.AsyncClient(base_url=vllm_url) as client:
        scraped = scraped_sample_names((await client.get("/metrics")).text)
    missing = {name for name in dashboard_metric_names() if name.startswith("vllm:")} - scraped
    assert not missing, missing


def test_the_survey_predicts_the_kv_capacity_this_server_logged(vllm_server, embedded_model_dir):
    import json
    from pathlib import Path

    from eval.capacity.kv_log import measured_capacity
    from eval.capacity.survey import GIB, survey_model

    server, spec = vllm_server
    measured = measured_capacity(Path(server.log))
    logged = measured["kv_capacity"]
    assert logged["device"] == "CPU" and logged["kv_cache_tokens"] > 0
    meta = {"license": "apache-2.0", "config": json.loads((embedded_model_dir / "config.json").read_text())}
    row = survey_model("smollm2-135m-instruct", meta, chip="cpu", max_model_len=logged["max_model_len"],
                       kv_cache_gib=spec.kv_cache_bytes / GIB, dtype=spec.dtype, measured=measured)  # fmt: skip
    assert row.kv_tokens == row.measured_kv_tokens == logged["kv_cache_tokens"]
    assert row.max_concurrency == pytest.approx(logged["max_concurrency"], abs=0.005)


async def test_a_tenants_cached_prompt_is_not_served_to_another_salt(vllm_server, tokenizer):
    """Issue 40: vLLM's prefix cache is salted per tenant (ReadRequest.cache_salt → vLLM's cache_salt).
    Tenant a reads a prompt; tenant b's identical prompt reports 0 cached tokens; a's again reports
    its whole blocks. Before salts, b's read reported a's blocks: what one tenant sent was readable
    through another's cached-token counts."""
    server, spec = vllm_server
    engine = await VLLMEngine.connect(server.url)
    text = "Account note for tenant a only: the customer's PIN is 4829, keep it private. " * 4
    prompt = tuple(tokenizer.encode(text, add_special_tokens=False))
    read = {
        salt: ReadRequest(prompt, (28, 29), ("A", "B"), cache_salt=salt) for salt in ("tenant:a", "tenant:b")
    }
    try:
        first = await engine.read(read["tenant:a"])
        other = await engine.read(read["tenant:b"])
        again = await engine.read(read["tenant:a"])
    finally:
        await engine.aclose()
    whole_blocks = (len(prompt) - 1) // spec.block_size * spec.block_size
    assert first.cached_tokens == 0 and other.cached_tokens == 0
    assert again.cached_tokens == whole_blocks > 0
    assert other.logprobs == pytest.approx(first.logprobs)  # the salt changes the cache, not the read


async def test_a_described_question_first_seen_computes_each_shared_block_once(vllm_server, client_factory):
    """Issue 43: the reads of a 26-option question with descriptions seen for the first time (its
    question and three content-free prior states, each over every level of its options' token trie,
    the option list shared by all of them) are sent at once, and vLLM computes what they share once:
    the computed tokens its replies report are at most the block floor, the fewest any order of
    these reads computes with whole KV blocks (``bench/latency_costs.block_floor_tokens``: each read
    computes its own last partial block, every whole block once). A block computed twice, by reads
    that missed each other's blocks, would show above it."""
    server, spec = vllm_server
    recording = ReadRecordingEngine(await VLLMEngine.connect(server.url))
    body = Bodies("short").option_body("choice26")  # tagged: nothing of it was read before
    try:
        async with client_factory(recording) as client:
            response = await client.post("/decide", json=body)
    finally:
        await recording.aclose()
    assert response.status_code == 200, response.text
    counts = token_counts(recording.take(), spec.block_size)
    assert counts["reads"] == 4 * 7  # the question and three prior states, 7 trie nodes each
    assert 0 < counts["computed_tokens"] <= counts["block_floor_tokens"]
