"""The examples in README.md, docs/api.md and docs/calibration.md, sent through the real service on
the embedded model, and the links between the docs.

An example is a fenced block right after a marker line (further comment lines may sit between):

    <!-- example: NAME request -->    a curl command (sh), or a body (json) for POST /v1/systemone
    <!-- example: NAME response -->   the whole response to NAME's request (json)
    <!-- example: NAME answer -->     the one answer of NAME's request, without its x_reading (json)
    <!-- example: calibrate-sst2 PART -->   a reply of docs/examples/calibrate_sst2.py's walk-through:
                                      fit, answer (without its x_reading), calibration, feedback

Each request goes through `service.app.create_app` around the embedded model's `LocalEngine`, over
ASGI. A shown value must have exactly the returned keys at every level, the same kind of value
(object, list of the same length, string, number, null) under each, and the same identity values
(question type, model, engine, read mode, label style, labels, prompt and read versions). Floats,
ids and timings are one run's and are not compared.

Regenerate every shown value after a change to the wire or the reads:
    PYTHONPATH=$PWD python -m tests.test_readme --write
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "api.md", ROOT / "docs" / "calibration.md")
WALK_THROUGH = "calibrate-sst2"
MARKED = re.compile(
    r"<!-- example: (?P<name>[\w-]+) (?P<part>[\w-]+) -->\n"
    r"(?:<!--[^\n]*-->\n)*```(?P<lang>sh|json)\n(?P<body>.*?)```",
    re.S,
)
# Fields that say what answered and how it was read: a doc showing an old value is stale.
IDENTITY = frozenset(
    {
        "type",
        "model",
        "model_revision",
        "name",
        "revision",
        "engine",
        "read_mode",
        "label_style",
        "labels",
        "prompt_version",
        "read_version",
    }
)
# Shown floats are rounded to this many significant digits; the prose beside the blocks says so.
DIGITS = 4
WIDTH = 110


@dataclass(frozen=True)
class Block:
    name: str
    part: str
    lang: str
    body: str
    start: int
    end: int


def marked_blocks(text: str) -> list[Block]:
    return [
        Block(m["name"], m["part"], m["lang"], m["body"], m.start("body"), m.end("body"))
        for m in MARKED.finditer(text)
    ]


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: object


def call_of(block: Block) -> Call:
    """The HTTP call a request block makes: a curl command line, or a body for POST /v1/systemone."""
    if block.lang == "json":
        return Call("POST", "/v1/systemone", json.loads(block.body))
    words = shlex.split(block.body.replace("\\\n", " "))
    assert words[0] == "curl", f"{block.name}: a request block is a curl command"
    (url,) = [w for w in words if w.startswith("http")]
    data = json.loads(words[words.index("-d") + 1]) if "-d" in words else None
    return Call("GET" if data is None else "POST", urlsplit(url).path, data)


async def send(client: httpx.AsyncClient, call: Call) -> dict:
    reply = await client.request(call.method, call.path, json=call.body)
    assert reply.status_code == 200, (call.path, reply.status_code, reply.text)
    return reply.json()


def jev_fields(answer: dict) -> dict:
    return {key: value for key, value in answer.items() if key != "x_reading"}


def request_views(response: dict) -> dict[str, object]:
    """What a block of each part shows of a request's response: all of it, or its one answer's Jev fields."""
    views: dict[str, object] = {"response": response}
    if "answers" in response:
        (answer,) = response["answers"].values()
        views["answer"] = jev_fields(answer)
    return views


def walk_through_views(replies: dict[str, dict]) -> dict[str, object]:
    answer = replies["answer"]
    return {
        "fit": replies["fit"],
        "answer": jev_fields(answer),
        "calibration": answer["x_reading"]["calibration"],
        "feedback": replies["feedback"],
    }


async def walk_through(client: httpx.AsyncClient) -> dict[str, dict]:
    """docs/examples/calibrate_sst2.py's walk-through (a script, not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("calibrate_sst2", ROOT / "docs/examples/calibrate_sst2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return await module.walk_through(client)


def kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {dict: "object", list: "list", str: "string", type(None): "null"}[type(value)]


def differences(shown: object, returned: object, where: str = "") -> list[str]:
    """Where a shown value's keys, kinds or identity fields differ from the returned one's."""
    if kind(shown) != kind(returned):
        return [f"{where or '.'}: shown a {kind(shown)}, returned a {kind(returned)}"]
    if isinstance(shown, list):
        if len(shown) != len(returned):
            return [f"{where}: shown {len(shown)} items, returned {len(returned)}"]
        return [
            d for i, (s, r) in enumerate(zip(shown, returned)) for d in differences(s, r, f"{where}[{i}]")
        ]
    if not isinstance(shown, dict):
        return []
    found = [f"{where}.{key}: shown, not returned" for key in shown.keys() - returned.keys()]
    found += [f"{where}.{key}: returned, not shown" for key in returned.keys() - shown.keys()]
    for key in shown.keys() & returned.keys():
        if key in IDENTITY and shown[key] != returned[key]:
            found.append(f"{where}.{key}: shown {shown[key]!r}, returned {returned[key]!r}")
        else:
            found += differences(shown[key], returned[key], f"{where}.{key}")
    return sorted(found)


def rounded(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.{DIGITS}g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item) for item in value]
    return value


def depth(value: object) -> int:
    if isinstance(value, dict | list) and value:
        return 1 + max(depth(item) for item in (value.values() if isinstance(value, dict) else value))
    return 0


def render(value: object, indent: int = 0, key: str = "") -> str:
    """JSON as the docs show it: a value on one line when it fits and nests at most two deep, else
    one key or item per line."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, dict | list) or (depth(value) <= 2 and indent + len(key) + len(flat) <= WIDTH):
        return flat
    inner = " " * (indent + 2)
    if isinstance(value, list):
        items = [inner + render(item, indent + 2) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [
        f"{inner}{json.dumps(k)}: {render(v, indent + 2, json.dumps(k) + ': ')}" for k, v in value.items()
    ]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def requests_in(text: str) -> dict[str, Block]:
    return {b.name: b for b in marked_blocks(text) if b.part == "request"}


def stale(path: Path, block: Block, views: dict[str, object]) -> list[str]:
    assert block.part in views, f"{path.name}: {block.name} has no part {block.part!r}"
    return differences(json.loads(block.body), views[block.part])


REGENERATE = "regenerate with `PYTHONPATH=$PWD python -m tests.test_readme --write`"
EXAMPLES = [
    pytest.param(path, name, id=f"{path.name}:{name}")
    for path in DOCUMENTS
    for name in requests_in(path.read_text())
]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_every_shown_value_has_its_source(path):
    blocks = marked_blocks(path.read_text())
    sources = {b.name for b in blocks if b.part == "request"} | {WALK_THROUGH}
    orphans = [f"{b.name} {b.part}" for b in blocks if b.part != "request" and b.name not in sources]
    assert blocks and not orphans, f"{path.name}: shown without a request: {orphans}"


def test_the_readme_shows_one_whole_response():
    blocks = marked_blocks((ROOT / "README.md").read_text())
    assert [b.part for b in blocks].count("response") == 1


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "name"), EXAMPLES)
async def test_shown_responses_are_what_the_service_returns(path, name, local_engine, client_factory):
    blocks = [b for b in marked_blocks(path.read_text()) if b.name == name]
    async with client_factory(local_engine) as client:
        views = request_views(await send(client, call_of(requests_in(path.read_text())[name])))
    for block in blocks:
        if block.part != "request":
            found = stale(path, block, views)
            assert not found, f"{path.name} {name} {block.part} is stale: {found}; {REGENERATE}"


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_calibration_walk_through_is_what_the_service_returns(
    local_engine, client_factory, tmp_path
):
    from calibration.open import open_store

    path = ROOT / "docs" / "calibration.md"
    blocks = [b for b in marked_blocks(path.read_text()) if b.name == WALK_THROUGH]
    assert {b.part for b in blocks} == {"fit", "answer", "calibration", "feedback"}
    async with client_factory(local_engine, store=open_store(tmp_path / "c.sqlite3")) as client:
        views = walk_through_views(await walk_through(client))
    for block in blocks:
        found = stale(path, block, views)
        assert not found, f"{path.name} {block.part} is stale: {found}; {REGENERATE}"


def test_a_stale_example_is_caught():
    """The comparison itself: an old prompt version, a field the service dropped, a missing one."""
    returned = {"x_provenance": {"prompt_version": "decide-prompt/4", "top_k": 5}, "usage": {"a": 1}}
    shown = {"x_provenance": {"prompt_version": "decide-prompt/1", "top_k": 7}, "usage": {"a": 2, "b": 1}}
    assert differences(shown, returned) == [
        ".usage.b: shown, not returned",
        ".x_provenance.prompt_version: shown 'decide-prompt/1', returned 'decide-prompt/4'",
    ]
    assert differences({"x": None}, {"x": {"p": 1}}) == [".x: shown a null, returned a object"]
    assert differences({}, {"labels": {"true": " Yes"}}) == [".labels: returned, not shown"]


LINKED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\((?!https?:|mailto:)(?P<target>[^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("path", LINKED, ids=lambda p: p.name)
def test_every_link_between_the_docs_resolves(path):
    broken = []
    for m in LINK.finditer(path.read_text()):
        file, _, anchor = m["target"].partition("#")
        target = (path.parent / file).resolve() if file else path
        if not target.exists() or (anchor and target.suffix == ".md" and anchor not in anchors(target)):
            broken.append(m["target"])
    assert not broken, f"{path.name}: broken links {broken}"


async def regenerate(paths: tuple[Path, ...]) -> None:
    """Rewrite every shown value from what the service returns now."""
    from calibration.open import open_store
    from readers.embedded import prepare_embedded_model
    from readers.engines.local import LocalEngine
    from service.app import create_app

    engine = LocalEngine(prepare_embedded_model())
    with tempfile.TemporaryDirectory() as scratch:
        app = create_app(engine, store=open_store(Path(scratch) / "c.sqlite3"))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://decide.test", timeout=300
        ) as client:
            for path in paths:
                text = path.read_text()
                views = {
                    name: request_views(await send(client, call_of(block)))
                    for name, block in requests_in(text).items()
                }
                blocks = [b for b in marked_blocks(text) if b.part != "request"]
                if any(b.name == WALK_THROUGH for b in blocks):
                    views[WALK_THROUGH] = walk_through_views(await walk_through(client))
                for block in sorted(blocks, key=lambda b: b.start, reverse=True):
                    shown = render(rounded(views[block.name][block.part]))
                    text = text[: block.start] + shown + "\n" + text[block.end :]
                path.write_text(text)
                print(f"{path.relative_to(ROOT)}: {len(blocks)} shown value(s) regenerated")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the shown values")
    if not parser.parse_args().write:
        sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
    asyncio.run(regenerate(DOCUMENTS))
