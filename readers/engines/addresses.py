"""Where the engines behind a routed engine are: the ``--engine-url`` forms and address sources.

http://a:8000                       one engine
http://a:8000,http://b:8000         a fixed list (``fixed_addresses``)
dns+http://NAME:8000                every address NAME resolves to (a headless Service's pods),
                                    looked up again on each refresh (``name_addresses``)
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from readers.errors import EngineUnavailable

NAME_SCHEME = "dns+"
"""``--engine-url dns+http://NAME:PORT``: route over every address NAME resolves to."""

Addresses = Callable[[], Awaitable[list[str]]]
"""An address source: called on each refresh, it returns the engines' base URLs now."""
Resolver = Callable[[str, int], list[str]]


def parse_engine_urls(spec: str) -> tuple[list[str], bool]:
    """``--engine-url`` → (base URLs, whether they name a DNS name to resolve).

    ``http://a:8000`` one engine; ``http://a:8000,http://b:8000`` several; ``dns+http://NAME:8000``
    every address of NAME. Raises ValueError naming what is wrong.
    """
    parts = [part.strip() for part in spec.split(",")]
    if not all(parts):
        raise ValueError(f"--engine-url {spec!r} has an empty entry")
    by_name = [part.startswith(NAME_SCHEME) for part in parts]
    if any(by_name) and len(parts) > 1:
        raise ValueError(f"--engine-url {spec!r}: a {NAME_SCHEME} name stands alone, not in a list")
    urls = [part.removeprefix(NAME_SCHEME).rstrip("/") for part in parts]
    for url in urls:
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"--engine-url entry {url!r} is not an http(s)://HOST[:PORT] URL")
    if len(set(urls)) < len(urls):
        raise ValueError(f"--engine-url {spec!r} names an engine twice")
    return urls, any(by_name)


def resolve_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, sorted (``socket.getaddrinfo``; a headless Service's pods)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def name_addresses(url: str, resolve: Resolver = resolve_addresses) -> Addresses:
    """An address source: ``url`` with its host replaced by each address the host resolves to."""
    split = urlsplit(url)
    port = split.port or (443 if split.scheme == "https" else 80)

    async def addresses() -> list[str]:
        try:
            found = await asyncio.to_thread(resolve, split.hostname, port)
        except OSError as error:
            raise EngineUnavailable(f"cannot resolve {split.hostname}: {error}") from None
        hosts = (f"[{address}]" if ":" in address else address for address in found)
        return [urlunsplit((split.scheme, f"{host}:{port}", split.path, "", "")) for host in hosts]

    return addresses


def fixed_addresses(urls: Sequence[str]) -> Addresses:
    """An address source that always returns ``urls``."""
    listed = [url.rstrip("/") for url in urls]

    async def addresses() -> list[str]:
        return list(listed)

    return addresses
