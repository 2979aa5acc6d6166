"""Compressed request bodies (zstd, as the TypeSafe SDK sends; gzip), limits and bad encodings."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

pytestmark = pytest.mark.anyio

BODY = {
    "state": "Order #1234 arrived broken. " * 60,  # > 1 KiB, the size at which the SDK compresses
    "questions": {"damaged": {"type": "noul", "instructions": "Did the item arrive damaged?"}},
}


async def post(client, content: bytes, encoding: str | None):
    headers = {"content-type": "application/json"}
    if encoding:
        headers["content-encoding"] = encoding
    return await client.post("/v1/systemone", content=content, headers=headers)


@pytest.mark.parametrize(
    "encoding, compress", [("zstd", zstandard.ZstdCompressor().compress), ("gzip", gzip.compress)]
)
async def test_compressed_bodies_answer_like_plain_ones(client_factory, local_engine, encoding, compress):
    raw = json.dumps(BODY).encode()
    async with client_factory(local_engine) as client:
        plain = await post(client, raw, None)
        packed = await post(client, compress(raw), encoding)
    assert plain.status_code == packed.status_code == 200, packed.text
    # The second request reuses the first one's keys and values: equal to float rounding.
    assert packed.json()["answers"]["damaged"]["noul"] == pytest.approx(
        plain.json()["answers"]["damaged"]["noul"], abs=1e-5
    )


async def test_unknown_encoding_is_415(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        response = await post(client, b"xx", "br")
    assert response.status_code == 415 and response.json()["detail"]["param"] == "Content-Encoding"


async def test_corrupt_stream_is_400(client_factory, local_engine):
    async with client_factory(local_engine) as client:
        response = await post(client, b"definitely not zstd", "zstd")
    assert response.status_code == 400 and response.json()["detail"]["error_type"] == "bad_encoding"


@pytest.mark.parametrize(
    "encoding, content",
    [
        ("zstd", zstandard.ZstdCompressor().compress(json.dumps(BODY).encode())[:-8]),  # truncated frame
        ("zstd", zstandard.ZstdCompressor().compress(json.dumps(BODY).encode()) + b"junk"),
        ("gzip", gzip.compress(json.dumps(BODY).encode()) + gzip.compress(b"{}")),  # a second member
    ],
    ids=["truncated-zstd", "zstd-trailing-junk", "gzip-two-members"],
)
async def test_incomplete_or_padded_streams_are_400(client_factory, local_engine, encoding, content):
    async with client_factory(local_engine) as client:
        response = await post(client, content, encoding)
    assert response.status_code == 400, response.text


async def test_decoded_size_is_limited(client_factory, local_engine):
    bomb = zstandard.ZstdCompressor().compress(b" " * 200_000)  # a few hundred bytes on the wire
    async with client_factory(local_engine, max_body_bytes=100_000) as client:
        response = await post(client, bomb, "zstd")
        plain = await post(client, b" " * 100_001, None)
    assert len(bomb) < 1000
    assert response.status_code == 413 and plain.status_code == 413
