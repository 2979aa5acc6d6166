"""Paired comparison of stored generation runs, the sweep table, and the throughput summary."""

from __future__ import annotations

import json

import httpx
import pytest

from eval.decisions.compare import ComparisonRefused
from eval.evidence.figures import plt  # the project's pyplot, on the file-only backend
from eval.evidence.manifest import MANIFEST, write_json
from eval.evidence.rows import RECORDS, write_rows
from eval.generation.compare import (
    compare_generation,
    plot_sweep_rows,
    speed_series,
    sweep_markdown,
    sweep_rows,
)
from eval.generation.throughput import run_throughput, summarize
from tests.eval.support import GENERATION_SETTINGS, stored_run


def test_two_problems_one_discordant_span_zero(tmp_path):
    # By hand: resampled differences are 0, 1/2 or 1 with chances 1/4, 1/2, 1/4, so the 2.5th and
    # 97.5th percentiles are 0 and 1: the interval spans zero.
    ref = stored_run(tmp_path / "ref", "a", [False, False])
    run = stored_run(tmp_path / "run", "b", [True, False])
    report = compare_generation(ref, run)
    assert report["difference"] == 0.5 and report["difference_ci95"] == [0.0, 1.0]
    assert not report["measurable"] and report["resamples"] == 10_000


def test_ten_of_twenty_better_is_measurable(tmp_path):
    # By hand: the resampled difference is X/20 with X ~ Binomial(20, 1/2); its 2.5% and 97.5%
    # quantiles are 6 and 14 (P(X <= 5) = 0.021, P(X <= 6) = 0.058), so about 0.30 to 0.70.
    ref = stored_run(tmp_path / "ref", "a", [False] * 20)
    run = stored_run(tmp_path / "run", "b", [True] * 10 + [False] * 10)
    report = compare_generation(ref, run)
    lo, hi = report["difference_ci95"]
    assert report["difference"] == 0.5 and report["measurable"]
    assert lo == pytest.approx(0.30, abs=0.05) and hi == pytest.approx(0.70, abs=0.05)
    assert report["mcnemar"] == {"only_a_right": 0, "only_b_right": 10, "p_value": pytest.approx(2 * 0.5**10)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_tokens": 256}, "max_tokens"),
        ({"seed": 1}, "seed"),
        ({"chat_template_kwargs": {}}, "chat_template_kwargs"),
    ],
)
def test_runs_of_other_settings_are_refused(tmp_path, change, message):
    ref = stored_run(tmp_path / "ref", "a", [True, False])
    run = stored_run(tmp_path / "run", "b", [True, False], **change)
    with pytest.raises(ComparisonRefused, match=message):
        compare_generation(ref, run)


def test_other_problems_and_failed_records_are_refused(tmp_path):
    ref = stored_run(tmp_path / "ref", "a", [True, False])
    with pytest.raises(ComparisonRefused, match="different problems"):
        compare_generation(ref, stored_run(tmp_path / "three", "b", [True, False, True]))
    with pytest.raises(ComparisonRefused, match="failed records"):
        compare_generation(ref, stored_run(tmp_path / "failed", "b", [True, False], status="error"))


def test_the_sweep_table_and_figure(tmp_path):
    ref = stored_run(tmp_path / "ref", "smollm2", [False] * 20)
    run = stored_run(tmp_path / "run", "gemma3", [True] * 10 + [False] * 10)
    for name, rate in (("smollm2", 10.0), ("gemma3", 5.0)):
        (tmp_path / f"speed-{name}").mkdir()
        summary = {"short@c1": {"output_tokens_per_s": rate}, "short@c16": {"output_tokens_per_s": rate * 4}}
        write_json(tmp_path / f"speed-{name}" / "summary.json", summary)
    rows = sweep_rows([ref], [[run]], throughput={m: tmp_path / f"speed-{m}" for m in ("smollm2", "gemma3")})
    table = sweep_markdown(rows)
    # Wilson 95% by hand: 0 of 20 is 0 to 3.84/(20 + 3.84) = 16.1%; 10 of 20 is 50% ± 20.1 pts.
    assert "| smollm2 (reference) | 0.0% (0.0%–16.1%, n 20) | — | 1.00 | 1.00 |" in table
    assert (
        "| gemma3 | 50.0% (29.9%–70.1%, n 20) | +50.0 pts (+30.0 to +70.0) |" in table
        and table.rstrip().endswith("| 0.50 | 0.50 |")
    )
    # the reference is the dashed line at 1, not a series
    assert speed_series(rows) == {("gemma3", "short"): [(1, 0.5), (16, 0.5)]}
    plot_sweep_rows(rows, tmp_path / "sweep.png")
    assert plt.imread(tmp_path / "sweep.png").shape[1] == 2 * 4.0 * 120  # accuracy panel, speed panel
    plot_sweep_rows(sweep_rows([ref], [[run]]), tmp_path / "no-speed.png")
    assert plt.imread(tmp_path / "no-speed.png").shape[1] == 4.0 * 120


def test_speed_series_follow_the_shapes_each_model_has():
    rows = [
        {
            "model": "ref",
            "reference": True,
            "speed_ratio": {"short@c1": 1.0, "short@c4": 1.0, "long-1024@c1": 1.0},
        },
        {"model": "b", "reference": False, "speed_ratio": {"short@c4": 0.8, "short@c1": 0.5}},
    ]
    assert speed_series(rows) == {("b", "short"): [(1, 0.5), (4, 0.8)]}  # sorted by concurrency


def test_one_cell_in_two_throughput_directories_is_refused(tmp_path):
    ref = stored_run(tmp_path / "ref", "smollm2", [False] * 4)
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        write_json(tmp_path / name / "summary.json", {"short@c1": {"output_tokens_per_s": 10.0}})
    with pytest.raises(ComparisonRefused, match="short@c1 is in more than one"):
        sweep_rows([ref], [], throughput={"smollm2": [tmp_path / "one", tmp_path / "two"]})


def test_the_throughput_summary_takes_medians_over_passes():
    rows = [
        {"shape": "short", "concurrency": 4, "pass": p, "pass_wall_s": wall, "ok": True, "prompt_tokens": 32,
         "output_tokens": 256, "ttft_ms": ttft, "per_token_ms": 10.0}
        for p, wall, ttft in ((0, 1.0, 50.0), (1, 2.0, 70.0), (2, 4.0, 60.0))
    ] + [{"shape": "short", "concurrency": 4, "pass": 2, "pass_wall_s": 4.0, "ok": False, "error": "http 500"}]  # fmt: skip
    s = summarize(rows)["short@c4"]
    assert s["output_tokens_per_s"] == 128.0 and s["output_tokens_per_s_range"] == [64.0, 256.0]
    assert s["ttft_ms_median"] == 60.0 and s["failed"] == 1 and s["requests"] == 4


@pytest.mark.anyio
async def test_the_throughput_sweep_sends_unique_prompts(tmp_path):
    prompts = []

    def server(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if path == "/version":
            return httpx.Response(200, json={"version": "t"})
        body = json.loads(request.content)
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": [hash(w) % 1000 for w in body["prompt"].split()]})
        prompts.append(tuple(body["prompt"]))
        assert body["ignore_eos"] and body["stream"]
        chunks = [{"choices": [{"text": "x"}]}] * body["max_tokens"] + [
            {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    summary = await run_throughput(
        "http://fake", tmp_path, concurrencies=(1, 4), shapes={"short": 8}, passes=2, waves=1, output_tokens=16,
        transport=httpx.MockTransport(server),
    )  # fmt: skip
    measured = prompts[1:]  # the first is the warm-up
    assert len(measured) == 2 * (1 + 4) and len(set(measured)) == len(measured)
    assert all(len(p) == 8 for p in measured)
    assert summary["short@c4"]["requests"] == 8 and summary["short@c4"]["failed"] == 0
    assert (tmp_path / "throughput.md").read_text().count("| short |") == 2


def test_the_commands_compare_and_tabulate_stored_runs(tmp_path):
    from typer.testing import CliRunner

    from eval.cli import app

    ref = stored_run(tmp_path / "ref", "smollm2", [False] * 20)
    run = stored_run(tmp_path / "run", "gemma3", [True] * 10 + [False] * 10)
    result = CliRunner().invoke(app, ["eval", "compare", str(ref), str(run)])
    assert result.exit_code == 0, result.output
    assert "| 0.0% | 50.0% | +50.0 pts (+30.0 to +70.0) | 0 / 10 |" in result.output
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "generation-table",
            "--reference",
            str(ref),
            "--run",
            str(run),
            "--out",
            str(tmp_path / "t"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "t" / "sweep.png").is_file() and "gemma3" in (tmp_path / "t" / "sweep.md").read_text()
    other = stored_run(tmp_path / "other", "gemma3", [True] * 20, max_tokens=256)
    result = CliRunner().invoke(app, ["eval", "compare", str(ref), str(other)])
    assert result.exit_code == 2 and "max_tokens" in result.output


@pytest.mark.anyio
async def test_a_killed_throughput_sweep_keeps_its_finished_passes_and_resumes(tmp_path):
    from eval.evidence.manifest import RunRefused

    class Killed(Exception):
        pass

    prompts, kill_after = [], [4]  # the warm-up, two passes at c1, then the first c4 request

    def server(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if path == "/version":
            return httpx.Response(200, json={"version": "t"})
        body = json.loads(request.content)
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": [hash(w) % 1000 for w in body["prompt"].split()]})
        if kill_after and len(prompts) == kill_after[0]:
            raise Killed  # the process stops mid-pass
        prompts.append(tuple(body["prompt"]))
        chunks = [{"choices": [{"text": "x"}]}] * 4 + [{"choices": [], "usage": {"completion_tokens": 4}}]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    settings = {"concurrencies": (1, 4), "shapes": {"short": 8}, "passes": 2, "waves": 1, "output_tokens": 4}
    with pytest.raises(Killed):
        await run_throughput("http://fake", tmp_path, transport=httpx.MockTransport(server), **settings)
    kept = [json.loads(line) for line in (tmp_path / "throughput.jsonl").read_text().splitlines()]
    assert [(r["concurrency"], r["pass"]) for r in kept] == [(1, 0), (1, 1)]
    assert json.loads((tmp_path / MANIFEST).read_text())["status"] == "started"

    kill_after.clear()
    before = len(prompts)
    summary = await run_throughput("http://fake", tmp_path, transport=httpx.MockTransport(server), **settings)
    resumed = prompts[before + 1 :]  # after this session's warm-up: only the two c4 passes
    assert len(resumed) == 2 * 4
    measured = prompts[1:3] + resumed
    assert len(set(measured)) == len(measured)  # no prompt repeats across the two sessions
    assert summary["short@c1"]["passes"] == 2 and summary["short@c4"]["requests"] == 8
    assert json.loads((tmp_path / MANIFEST).read_text())["status"] == "success"
    with pytest.raises(RunRefused, match="settings"):
        await run_throughput(
            "http://fake", tmp_path, transport=httpx.MockTransport(server), **settings | {"passes": 3}
        )


def bfcl_run(path, model, parsed, with_text):
    """A BFCL run directory: per problem, right by the server's parsed calls and counting text calls."""
    path.mkdir()
    ids = [f"simple_{i}" for i in range(len(parsed))]
    args = GENERATION_SETTINGS | {"task": "bfcl_simple", "tools_in_prompt": True}
    write_json(path / MANIFEST, {"run": "generate", "server": {"model": model}, "data_sha256": {"bfcl": "x"},
                                 "args": args, "record_ids": ids})  # fmt: skip
    rows = [{"task": "bfcl_simple", "id": i, "variant": "greedy", "status": "ok", "correct": p,
             "correct_with_text": t, "truncated": False} for i, p, t in zip(ids, parsed, with_text)]  # fmt: skip
    write_rows(path / RECORDS, rows)
    return path


def test_bfcl_is_also_compared_counting_calls_read_from_the_text(tmp_path):
    # No call parsed by the server in either run (0 vs 0: the interval is [0, 0], spanning zero);
    # counting text calls, 10 of 20 right against none: by hand +50 pts (+30 to +70) as above.
    ref = bfcl_run(tmp_path / "ref", "smollm2", [False] * 20, [False] * 20)
    run = bfcl_run(tmp_path / "run", "gemma3", [False] * 20, [True] * 10 + [False] * 10)
    report = compare_generation(ref, run)
    assert report["difference_ci95"] == [0.0, 0.0] and not report["measurable"]
    text = report["with_text"]
    assert text["outcome"] == "correct_with_text" and text["difference"] == 0.5
    assert text["difference_ci95"] == pytest.approx([0.3, 0.7]) and text["measurable"]
    rows = sweep_rows([ref], [[run]])
    plot_sweep_rows(rows, tmp_path / "sweep.png")  # 0 of 20: a Wilson interval from exactly 0
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert set(rows[1]["tasks"]) == {"bfcl_simple", "bfcl_simple with text calls"}
    assert rows[0]["tasks"]["bfcl_simple with text calls"]["accuracy"] == 0.0
    assert "+50.0 pts (+30.0 to +70.0)" in sweep_markdown(rows)


def test_the_sweep_merges_a_models_throughput_runs_of_other_shapes(tmp_path):
    ref = stored_run(tmp_path / "ref", "smollm2", [False] * 4)
    run = stored_run(tmp_path / "run", "gemma3", [False] * 4)
    speeds = {}
    for name, rate in (("smollm2", 10.0), ("gemma3", 5.0)):
        for shape in ("short", "long-1024"):
            path = tmp_path / f"speed-{name}-{shape}"
            path.mkdir()
            write_json(
                path / "summary.json",
                {f"{shape}@c4": {"output_tokens_per_s": rate * (2 if shape == "short" else 1)}},
            )
            speeds.setdefault(name, []).append(path)
    rows = sweep_rows([ref], [[run]], throughput=speeds)
    assert rows[1]["speed_ratio"] == {"short@c4": 0.5, "long-1024@c4": 0.5}
