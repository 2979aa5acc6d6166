"""The fast tier's guard: a test not marked ``integration`` fails if it starts a process or reaches past
loopback.

The fast tier (``pytest -m "not slow and not integration"``) is the inner loop, and only stays one while
it stays in this process: a label alone drifts (the fast tier once downloaded wheels and ran the cloud
CLIs). So the guard watches Python's audit events (PEP 578) while a test's setup and call run:

- a process: ``subprocess.Popen`` (and so ``asyncio``'s subprocesses), ``os.system``, ``os.posix_spawn``,
  ``os.spawn*``, ``os.fork``/``os.forkpty``, ``os.exec*``;
- the network: ``socket.connect``/``socket.sendto`` to an address that is not loopback, and name
  look-ups (``socket.getaddrinfo``, ``gethostbyname``, ``gethostbyaddr``) of a name that is not local.

The hook raises ``pytest.fail``'s exception (a BaseException, so ``except Exception`` in the code under
test does not swallow it) before the process starts or the packet leaves, and also records the event,
so a test whose violation was caught anyway (or happened on another thread) still fails at its end,
naming the test and the event.

Not watched, on purpose: teardown, because a session-scoped server started by an integration test is
stopped in the teardown of whichever test happens to run last. Not seen: multiprocessing's ``spawn`` and
``forkserver`` starts, which CPython does not audit (``fork``, the Linux default, is).

Audit hooks cannot be removed, so one hook is added per process, the first time a guard is registered;
it is inert whenever no guarded test is running.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.exec"}
)
ADDRESS_EVENTS = frozenset({"socket.connect", "socket.sendto"})  # (socket, address)
NAME_EVENTS = frozenset({"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"})
ADDRESS_LOOKUP_EVENTS = frozenset({"socket.gethostbyaddr"})
WATCHED = PROCESS_EVENTS | ADDRESS_EVENTS | NAME_EVENTS | ADDRESS_LOOKUP_EVENTS

LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
HOSTNAME = socket.gethostname().lower()  # this machine: resolved from /etc/hosts, never a network


def is_local_host(host: object) -> bool:
    """Loopback or this machine itself: a name or address that never leaves the host."""
    if host is None or not isinstance(host, str | bytes):
        return True  # no host (a passive look-up) or a non-IP family's address (netlink: integers)
    name = host.decode() if isinstance(host, bytes) else host
    name = name.strip("[]").split("%")[0].lower()  # "[::1]", "fe80::1%eth0"
    if name in LOCAL_NAMES or name == HOSTNAME:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a name that needs a resolver
    return address.is_loopback or address.is_unspecified


def command(event: str, args: tuple) -> str:
    """The program an audited process event names, for the failure message ("" for a bare fork)."""
    if event == "subprocess.Popen":  # (executable, args, cwd, env); args a list, or a string with shell=True
        argv = args[1]
        return f": {argv if isinstance(argv, str | bytes) else ' '.join(map(str, argv))}"
    if event == "os.spawn":  # (mode, path, args, env)
        return f": {args[1]}"
    return f": {args[0]}" if args else ""


def violation(event: str, args: tuple) -> str | None:
    """What a fast-tier test must not do, described, or None when the event is allowed."""
    if event in PROCESS_EVENTS:
        return f"started a process ({event}{command(event, args)})"
    if event in ADDRESS_EVENTS:
        address = args[1]
        if isinstance(address, tuple) and address and not is_local_host(address[0]):
            return f"reached past loopback ({event} to {address[0]}:{address[1]})"
        return None  # loopback, a Unix socket path or another local family
    if event in NAME_EVENTS and not is_local_host(args[0]):
        return f"looked up a network name ({event} {args[0]!r})"
    if event in ADDRESS_LOOKUP_EVENTS and not is_local_host(args[0]):
        return f"looked up a network address ({event} {args[0]!r})"
    return None


@dataclass
class Watch:
    """One guarded phase of one test: its id and what it did that the fast tier forbids."""

    nodeid: str
    phase: str
    violations: list[str] = field(default_factory=list)

    def message(self) -> str:
        return (
            f"{self.nodeid} ({self.phase}) is in the fast tier but "
            + "; ".join(self.violations)
            + ". Mark it @pytest.mark.integration, or keep the work in this process on loopback."
        )


_watches: list[Watch | None] = []  # innermost last; None: an unguarded (integration) test is running
_lock = threading.Lock()
_hooked = False


def _audit(event: str, args: tuple) -> None:
    __tracebackhide__ = True  # the failure points at the test's line, not at this hook
    if event not in WATCHED or not _watches:  # the cheap exit: every audit event in the process comes here
        return
    watch = _watches[-1]
    if watch is None:
        return
    found = violation(event, args)
    if found is None:
        return
    with _lock:
        watch.violations.append(found)
    raise pytest.fail.Exception(watch.message())  # with the traceback: where the test did it


def _install() -> None:
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True


@contextmanager
def watching(nodeid: str, phase: str, guarded: bool) -> Iterator[Watch | None]:
    """Guard what runs inside (when ``guarded``); fail at the end if a violation was swallowed."""
    watch = Watch(nodeid, phase) if guarded else None
    _watches.append(watch)
    try:
        yield watch
    except BaseException as raised:
        if watch is None or not watch.violations or isinstance(raised, pytest.fail.Exception):
            raise
        raise pytest.fail.Exception(watch.message(), pytrace=False) from raised  # the real cause first
    else:
        if watch is not None and watch.violations:  # swallowed by the code under test, or on a thread
            pytest.fail(watch.message(), pytrace=False)
    finally:
        _watches.pop()


class TierGuard:
    """The pytest plugin: each test's setup and call, watched unless the test is marked integration."""

    def __init__(self) -> None:
        _install()

    @staticmethod
    def guarded(item: pytest.Item) -> bool:
        return item.get_closest_marker("integration") is None

    @staticmethod
    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        """``alone`` tests run one at a time after make test's two workers; make test-fast has no
        such pass, so an ``alone`` test must be out of the fast tier (slow or integration)."""
        loose = [
            item.nodeid
            for item in items
            if item.get_closest_marker("alone")
            and not (item.get_closest_marker("slow") or item.get_closest_marker("integration"))
        ]
        if loose:
            raise pytest.UsageError(
                "marked alone but in the fast tier (mark it slow or integration too): " + ", ".join(loose)
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        with watching(item.nodeid, "setup", self.guarded(item)):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        with watching(item.nodeid, "call", self.guarded(item)):
            return (yield)
