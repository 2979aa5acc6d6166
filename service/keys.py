"""API keys: the key file's format, the key set, and its live reload. Each key names its tenant and
its scopes (``service/scopes.py``); the middleware that checks ``Authorization: Bearer <key>``
against the live set is ``service/middleware/auth.py``.

The key file holds one key a line (blank lines and ``#`` comments skipped), optionally followed by
fields::

    KEY tenant=NAME scopes=decide,calibrate,admin weight=2 tokens_per_minute=600000 cache_group=NAME

A key is ``MIN_KEY_CHARS`` to ``MAX_KEY_CHARS`` ASCII letters, digits and ``-_.~+/`` (``KEY_PATTERN``:
hex, base64 without padding, base64url, ``secrets.token_urlsafe``). A line whose first word is not
that is an error naming its line number, never a key: a ``.env`` swapped in by mistake
(``DATABASE_URL=…``) must not become a set of keys that locks the real ones out. A file with no key
line (empty, or comments only) is an error too: ``decide serve`` refuses it unless ``--no-auth``, and a
reload that finds it keeps the old set. A UTF-8 byte order mark (Windows editors write one) is
dropped. Only a regular file is read (``read_key_file``): a FIFO, a directory or a device is refused
without reading, so a FIFO swapped in cannot block the service.

``weight`` and ``tokens_per_minute`` are the tenant's share of the service (``service.scopes.Share``:
default weight 1, no token limit of its own); ``cache_group`` names a prompt-cache group its reads
share with the other tenants that name it (``service.scopes.Caller.cache_salt``; default: the tenant's
own, named like a tenant). Every key of one tenant must give the same ones.
A bare ``KEY`` is tenant ``default`` with scopes ``decide,calibrate`` (the format before tenants:
every key then shares one tenant, and the start-up log says so). ``admin`` is never implied.
``$OPENDECIDE_API_KEYS`` holds the same items: separated by ``;`` when the value holds a ``;`` or any
item has fields (a ``scopes=`` list has commas), else the old comma-separated list of bare keys.

Only the keys' SHA-256 digests are held, and a presented key is compared against every digest with
``hmac.compare_digest`` (no early exit), so neither the keys' text nor the time a comparison takes says
anything about them. A caller is known in logs, audit lines and rate limits by its ``key_id``: the
first 12 hex digits of the digest, never the key.

The key set is live (``Keyring``): the file is re-read when it changes (polled) and on SIGHUP; a reload
that fails keeps the old set and logs why. SIGHUP never ends the process: ``decide serve`` handles it
from its first instant (``hold_sighup``), logging that there is nothing to reload while it starts, when
keys come only from ``$OPENDECIDE_API_KEYS`` (read once) or when there are none. Without keys the
service must bind to loopback only; ``check_bind`` refuses any other address unless ``--no-auth`` says
the operator means it.

Keys travel only in ``Authorization: Bearer``: a query string naming a key-like parameter
(``KEY_PARAMS``) is refused by the auth middleware, and ``redact_query`` blanks such values in every
log line that prints a path (uvicorn's access line, ``redact_access_log``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import signal
import stat
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from calibration.store import DEFAULT_TENANT
from service.audit import audit
from service.scopes import DEFAULT_SCOPES, EQUAL_SHARE, SCOPES, Caller, Share

logger = logging.getLogger("opendecide.auth")

KEYS_ENV = "OPENDECIDE_API_KEYS"
MIN_KEY_CHARS = 16
MAX_KEY_CHARS = 256
KEY_PATTERN = re.compile(rf"[A-Za-z0-9._~+/-]{{{MIN_KEY_CHARS},{MAX_KEY_CHARS}}}")
MAX_KEY_FILE_BYTES = 1 << 20
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_KEY_POLL_S = 2.0
SETTLE_READS = 5


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_id(key_digest: bytes) -> str:
    return key_digest.hex()[:12]


@dataclass(frozen=True)
class ApiKey:
    digest: bytes
    tenant: str
    scopes: frozenset[str]
    bare: bool
    """Given without fields (the format before tenants)."""
    share: Share = EQUAL_SHARE
    cache_group: str | None = None

    @property
    def caller(self) -> Caller:
        return Caller(self.tenant, key_id(self.digest), self.scopes, self.share, self.cache_group)


@dataclass(frozen=True)
class KeySet:
    keys: tuple[ApiKey, ...]

    def match(self, presented: str) -> ApiKey | None:
        wanted = digest(presented)
        matched = None
        for known in self.keys:  # every digest compared: the time taken does not depend on which matched
            if hmac.compare_digest(wanted, known.digest):
                matched = known
        return matched

    def describe(self) -> list[dict]:
        """What an admin may see of the set: key ids, tenants, scopes; never a key."""
        return [
            {"key_id": key_id(k.digest), "tenant": k.tenant, "scopes": sorted(k.scopes),
             "weight": k.share.weight, "tokens_per_minute": k.share.tokens_per_minute,
             "cache_group": k.cache_group}
            for k in self.keys
        ]  # fmt: skip

    def notice(self) -> str:
        """The start-up line: how many keys, and whether the file is in the format before tenants."""
        tenants = sorted({k.tenant for k in self.keys})
        if all(k.bare for k in self.keys):
            return (
                f"authentication on: {len(self.keys)} API key(s) in the old format (no fields): every key is "
                f"tenant '{DEFAULT_TENANT}' with scopes {','.join(sorted(DEFAULT_SCOPES))}"
            )
        return f"authentication on: {len(self.keys)} API key(s), tenants {', '.join(tenants)}"


SHARE_FIELDS = ("weight", "tokens_per_minute")
FIELDS = ("tenant", "scopes", *SHARE_FIELDS, "cache_group")


class EmptyKeyFile(ValueError):
    """A key file with no key line: refused, unless auth is off on purpose (``--no-auth``)."""


def parse_key(text: str, where: str) -> ApiKey:
    """One key item: ``KEY [tenant=NAME] [scopes=a,b] [weight=W] [tokens_per_minute=N] [cache_group=NAME]``.
    ``ValueError`` names ``where``, never the key nor the line."""
    key, *fields = text.split()
    if not KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"API key at {where}: a key is {MIN_KEY_CHARS}-{MAX_KEY_CHARS} ASCII letters, digits, '-', '_', '.', "
            "'~', '+' or '/', first on its line (is this a key file?)"
        )
    given: dict[str, str] = {}
    for item in fields:
        name, eq, value = item.partition("=")
        if not eq or name not in FIELDS:
            raise ValueError(
                f"API key at {where}: after the key come only {', '.join(f + '=' for f in FIELDS)}, "
                "separated by spaces"
            )
        if name in given:
            raise ValueError(f"API key at {where}: {name} given twice")
        given[name] = value
    tenant = given.get("tenant", DEFAULT_TENANT)
    cache_group = given.get("cache_group")
    for name, value in (("tenant", tenant), ("cache_group", cache_group)):
        if value is not None and not TENANT_PATTERN.fullmatch(value):
            raise ValueError(
                f"API key at {where}: a {name} is 1-64 letters, digits, '_', '.' or '-', starting with a "
                "letter or digit"
            )
    scopes = frozenset(given["scopes"].split(",")) if "scopes" in given else DEFAULT_SCOPES
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        raise ValueError(f"API key at {where}: unknown scope(s) {unknown}; scopes are {', '.join(SCOPES)}")
    try:
        share = Share(
            weight=float(given.get("weight", 1.0)),
            tokens_per_minute=int(given["tokens_per_minute"]) if "tokens_per_minute" in given else None,
        )
    except ValueError as error:
        raise ValueError(
            f"API key at {where}: weight is a positive number and tokens_per_minute a whole number of "
            f"at least 1 ({error})"
        ) from None
    return ApiKey(digest(key), tenant, scopes, bare=not fields, share=share, cache_group=cache_group)


def read_key_file(path: Path) -> str:
    """The key file's text, BOM dropped. Only a regular file is read: the open does not wait (a FIFO
    would block until a writer came, and the service with it) and the opened file's own type is
    checked before any read, so a FIFO, a directory or a device is refused without reading."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a directory"
                if stat.S_ISDIR(mode)
                else "a device or socket"
            )
            raise ValueError(f"{path} is not a regular file ({kind}); keys are read only from a regular file")
        data = b""
        while len(data) <= MAX_KEY_FILE_BYTES:
            chunk = os.read(fd, MAX_KEY_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_KEY_FILE_BYTES} bytes: not a key file")
    return data.decode("utf-8-sig")  # a leading BOM would otherwise be part of the first key


def env_items(value: str) -> list[str]:
    """``$OPENDECIDE_API_KEYS``'s items: ``;``-separated when any item has fields (or a ``;`` is there),
    else the old comma list. Refuses a key holding a comma in the ``;`` form: it could only be two
    items of the comma form written with fields, which is ambiguous."""
    fielded = ";" in value or any(len(item.split()) > 1 for item in value.split(","))
    if not fielded:
        return [item.strip() for item in value.split(",")]
    items = [item.strip() for item in value.split(";")]
    for index, item in enumerate(items, start=1):
        if item and "," in item.split()[0]:
            raise ValueError(
                f"{KEYS_ENV} item {index}: a key holds ','; when any item has fields, separate items with ';'"
            )
    return items


def load_key_set(path: Path | None = None, environ: dict[str, str] | None = None) -> KeySet:
    """Keys from ``path`` and ``$OPENDECIDE_API_KEYS``, in that order.

    Raises ``ValueError`` for a malformed item or a key given twice, naming its line (never the key)."""
    environ = os.environ if environ is None else environ
    found: list[tuple[str, str]] = []
    if path is not None:
        for number, line in enumerate(read_key_file(Path(path)).splitlines(), start=1):
            text = line.strip()
            if text and not text.startswith("#"):
                found.append((f"{path} line {number}", text))
        if not found:
            raise EmptyKeyFile(f"the key file {path} holds no API key (only blank lines or # comments)")
    for index, item in enumerate(env_items(environ.get(KEYS_ENV, "")), start=1):
        if item:
            found.append((f"{KEYS_ENV} item {index}", item))
    keys: list[ApiKey] = []
    seen: dict[bytes, str] = {}
    shares: dict[str, tuple[tuple[Share, str | None], str]] = {}
    for where, text in found:
        key = parse_key(text, where)
        if key.digest in seen:
            raise ValueError(f"API key at {where} repeats the key at {seen[key.digest]}")
        seen[key.digest] = where
        # One tenant, one share and one cache group: admission keys its queue by tenant, and a
        # tenant's reads share one prompt cache, whichever key asked.
        (share, group), first = shares.setdefault(key.tenant, ((key.share, key.cache_group), where))
        if share != key.share:
            raise ValueError(
                f"API key at {where}: tenant {key.tenant!r} has another weight or tokens_per_minute at "
                f"{first}; give every key of a tenant the same ones"
            )
        if group != key.cache_group:
            raise ValueError(
                f"API key at {where}: tenant {key.tenant!r} has another cache_group at {first}; give "
                "every key of a tenant the same one"
            )
        keys.append(key)
    return KeySet(tuple(keys))


class Keyring:
    """The live key set. ``reload`` swaps it in one assignment (requests read ``current`` once), so a
    request sees the old set or the new one, never a mix; a reload that fails, or would leave no key,
    keeps the old set and logs why."""

    def __init__(
        self,
        path: Path | None = None,
        environ: dict[str, str] | None = None,
        *,
        poll_s: float = DEFAULT_KEY_POLL_S,
        keys: KeySet | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.environ = dict(os.environ if environ is None else environ)
        self.poll_s = poll_s
        if keys is None:
            self._stamp, keys = self._read_settled()
        else:
            self._stamp = self._file_stamp()
        self.current = keys

    @classmethod
    def of(cls, keys: Iterable[str]) -> Keyring:
        """A fixed ring of bare keys (tenant default): what ``create_app(api_keys=[...])`` is given in code."""
        items = list(keys)
        return cls(
            None, {}, keys=KeySet(tuple(parse_key(k, f"key {i}") for i, k in enumerate(items, start=1)))
        )

    def _file_stamp(self) -> tuple[int, int, int] | None:
        # Follows symlinks: a Kubernetes Secret volume swaps a symlink to a new directory on update.
        try:
            stat = self.path.stat() if self.path is not None else None
        except OSError:
            return None
        return None if stat is None else (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def changed_on_disk(self) -> bool:
        return self.path is not None and self._file_stamp() != self._stamp

    def _read_settled(self) -> tuple[tuple[int, int, int] | None, KeySet]:
        """The key set and the file stamp it was read under, the same before and after the read: an
        in-place edit caught half-written (its stamp changes as the writer goes on) is read again, not
        taken for a poll interval with the rest of its keys missing. Raises ``ValueError`` when the
        file keeps changing for ``SETTLE_READS`` reads, or what ``load_key_set`` raises."""
        for _ in range(SETTLE_READS):
            before = self._file_stamp()
            try:
                fresh = load_key_set(self.path, self.environ)
            except (OSError, ValueError, UnicodeDecodeError):
                if self._file_stamp() == before:
                    raise
                continue  # a half-written file may not parse: read it again once it moved on
            if self._file_stamp() == before:
                return before, fresh
        raise ValueError(f"the key file changed during each of {SETTLE_READS} reads")

    def reload(self, trigger: str) -> bool:
        """Read the file (and environment) again; True when the new set is in place."""
        try:
            self._stamp, fresh = self._read_settled()
            if not fresh.keys:
                raise ValueError(
                    "the new key set is empty (auth stays on; remove keys by restarting without them)"
                )
        except (OSError, ValueError, UnicodeDecodeError) as error:
            self._stamp = self._file_stamp()  # refused once: polled again only when the file changes again
            logger.warning(
                "API keys not reloaded (%s): %s; keeping the %d key(s) in use",
                trigger,
                error,
                len(self.current.keys),
            )
            audit(
                "key_set_reload_refused",
                None,
                trigger=trigger,
                reason=str(error),
                keys=len(self.current.keys),
            )
            return False
        old = {k["key_id"]: k for k in self.current.describe()}
        new = {k["key_id"]: k for k in fresh.describe()}
        self.current = fresh
        audit(
            "key_set_changed", None, trigger=trigger, keys=len(new),
            added=sorted(new.keys() - old.keys()), removed=sorted(old.keys() - new.keys()),
            changed=sorted(k for k in new.keys() & old.keys() if new[k] != old[k]),
        )  # fmt: skip
        return True

    async def watch(self) -> None:
        """Poll the file every ``poll_s``; reload when its mtime, size or inode changed."""
        if self.path is None:
            return
        while True:
            await asyncio.sleep(self.poll_s)
            if self.changed_on_disk():
                self.reload("file changed")


def watch_key_file(keyring: Keyring) -> Callable[[], None]:
    """Poll the key file and re-read it on SIGHUP; returns what stops both."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(keyring.watch())
    previous = signal.getsignal(signal.SIGHUP)
    try:
        loop.add_signal_handler(signal.SIGHUP, keyring.reload, "SIGHUP")
        hup = True
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread (a server in a thread)
        hup = False

    def stop() -> None:
        task.cancel()
        if hup:
            loop.remove_signal_handler(signal.SIGHUP)
            if callable(previous):  # removing leaves the default action, the end of the process
                signal.signal(signal.SIGHUP, previous)

    return stop


def hold_sighup(reason: str) -> Callable | int | None:
    """Take SIGHUP now, whatever the keys' source: log that there is nothing to reload (``reason``)
    instead of the default action, which ends the process. ``watch_key_file`` takes the signal over
    while a key file is watched. Returns the handler replaced (None outside the main thread, where
    signals cannot be taken)."""

    def nothing_to_reload(signum: int, frame: object) -> None:
        logger.warning("SIGHUP: nothing to reload (%s)", reason)

    try:
        return signal.signal(signal.SIGHUP, nothing_to_reload)
    except ValueError:  # not the main thread
        return None


KEY_PARAMS = frozenset({"api_key", "apikey", "api-key", "key", "access_token", "token", "authorization"})
"""Query parameters that carry a key by some clients' habit: refused on requests, redacted in logs."""
_QUERY_ITEM = re.compile(r"([?&;])([^=&;#\s\"]*)=([^&;#\s\"]*)")


def key_params_in(query: str) -> list[str]:
    """The key-like parameter names of a query string, as given (percent-decoded)."""
    return [
        name
        for name, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)
        if name.lower() in KEY_PARAMS
    ]


def redact_query(text: str) -> str:
    """``text`` with the values of key-like query parameters replaced by ``[redacted]``."""

    def blank(item: re.Match) -> str:
        secret = urllib.parse.unquote_plus(item[2]).lower() in KEY_PARAMS and item[3]
        return f"{item[1]}{item[2]}=[redacted]" if secret else item[0]

    return _QUERY_ITEM.sub(blank, text)


class RedactKeys(logging.Filter):
    """Redacts key-like query values in a record's message and arguments (uvicorn's access line
    passes the path with its query as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(a) if isinstance(a, str) else a for a in record.args)
        return True


def redact_access_log(name: str = "uvicorn.access") -> None:
    """Put ``RedactKeys`` on the logger ``name`` (once): call it after uvicorn configured its logging."""
    target = logging.getLogger(name)
    if not any(isinstance(found, RedactKeys) for found in target.filters):
        target.addFilter(RedactKeys())


def check_bind(host: str, *, has_keys: bool, no_auth: bool) -> str | None:
    """Refuse to serve without keys on a non-loopback address unless ``no_auth``; returns the warning
    to log when auth is off, or None when keys are on."""
    if has_keys:
        return None
    loopback = host == "localhost" or _is_loopback(host)
    if not loopback and not no_auth:
        raise ValueError(
            f"refusing to serve on {host} without API keys: pass --api-key-file or set {KEYS_ENV}, "
            "or --no-auth to serve anyone who can reach the port"
        )
    return f"authentication is OFF: anyone who can reach {host} may call this service"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
