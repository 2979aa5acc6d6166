"""The public suite in Nimble's record format: run it through an engine and score the run.

``decide eval suite`` is :func:`score_suite_with_engine`: the records (:mod:`eval.suite.records`:
format, build, validation, checksums) are read through the engine as ``decide serve`` answers
(:func:`run_suite`, resumable), then scored (:mod:`eval.suite.score`) into ``suite.json`` and
``suite.md`` (:mod:`eval.suite.table`).
"""

from __future__ import annotations

from pathlib import Path

from eval.evidence.manifest import MANIFEST, Images, check_directory, run_manifest, write_json
from eval.evidence.rows import RECORDS, RecordWriter
from eval.suite.records import SuiteRecord, load_suite
from eval.suite.score import RESAMPLES, score_suite
from eval.suite.table import suite_table
from readers.engines.base import Engine
from readers.prompt import PROMPT_VERSION, prompt_layout
from readers.reader import Reader
from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION, OptionPriors, PriorCorrection


async def run_suite(
    engine: Engine,
    data: Path,
    out: Path,
    *,
    concurrency: int = 4,
    allow_unverified: bool = False,
    allow_mismatch: bool = False,
    images: Images | None = None,
    prior_correction: PriorCorrection = DEFAULT_PRIOR_CORRECTION,
    prompt_version: str = PROMPT_VERSION,
) -> dict:
    """Read (or resume) every suite record at ``data`` into ``out``, answered as ``decide serve``
    answers with ``prior_correction``, under the layout ``prompt_version`` (an earlier one only to
    compare layouts); returns the final manifest (with each subset's checksum check under ``checksums``)."""
    layout = prompt_layout(prompt_version)  # an unknown layout is refused before anything is read
    records, checks = load_suite(data, allow_unverified=allow_unverified, allow_mismatch=allow_mismatch)
    prior_correction = PriorCorrection(prior_correction)
    out.mkdir(parents=True, exist_ok=True)
    args = {"data": str(data), "concurrency": concurrency, "prior_correction": prior_correction.value}
    manifest = run_manifest(
        "suite",
        engines={"run": engine},
        args=args,
        images=images,
        status="started",
        prompt_version=prompt_version,
    )
    manifest["data_sha256"] = {subset: check["sha256"] for subset, check in checks.items()}
    manifest["checksums"] = checks
    check_directory(out, manifest)
    write_json(out / MANIFEST, manifest)
    fields = ("id", "subset", "question_type", "family", "gold")

    def base(r: SuiteRecord) -> dict:
        row = {
            **{name: getattr(r, name) for name in fields},
            "task": r.subset,
            "variant": "original",
            "options": list(r.options),
        }
        return row | ({"distribution": r.distribution} if r.distribution is not None else {})

    async with RecordWriter(out / RECORDS) as sink:
        priors = None if prior_correction is PriorCorrection.OFF else OptionPriors(prior_correction)
        await sink.read_all(
            Reader(engine, layout=layout),
            [(base(r), r.body, r.question) for r in records],
            concurrency=concurrency,
            priors=priors,
        )
    manifest["status"] = "success"
    manifest["records"] = len(records)
    write_json(out / MANIFEST, manifest)
    return manifest


async def score_suite_with_engine(
    engine_spec: str,
    data: Path,
    out: Path,
    *,
    engine_url: str | None = None,
    top_k: int | None = None,
    resamples: int = RESAMPLES,
    **options,
) -> dict:
    """Open the engine ``engine_spec`` names, :func:`run_suite` through it, then score the run into
    ``out`` (suite.json, suite.md, ``resamples`` family-bootstrap resamples); returns the report."""
    from readers.engines import open_engine_spec

    async with await open_engine_spec(engine_spec, top_k=top_k, engine_url=engine_url) as engine:
        await run_suite(engine, data, out, **options)
    report = score_suite(out, resamples=resamples)
    write_json(out / "suite.json", report)
    (out / "suite.md").write_text(suite_table(report))
    return report
