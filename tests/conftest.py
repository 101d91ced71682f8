"""Shared fixtures and the CI rule that a skipped test is a failure.

Set ``EDGE_NODE_NO_SKIP=1`` (``.ci/run`` does) and any skipped test fails the session: in CI root and
the CIFAR-10 tarball are present, so a skip there means a check silently did not run.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CIFAR10_TGZ = REPO_ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"

_skipped: list[str] = []


def cifar10_tarball() -> Path | None:
    """The CIFAR-10 image-folder tarball from ``EDGE_NODE_CIFAR10_TGZ`` or ``../shared/datasets``."""
    path = Path(os.environ.get("EDGE_NODE_CIFAR10_TGZ", DEFAULT_CIFAR10_TGZ))
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def cifar10_tgz() -> Path:
    path = cifar10_tarball()
    if path is None:
        pytest.skip("CIFAR-10 tarball absent: set EDGE_NODE_CIFAR10_TGZ or provide ../shared/datasets")
    return path


@pytest.fixture(scope="session", autouse=True)
def _decoder_compiled() -> None:
    """Compile the decoder's numba loop once, as a daemon does at start: a test that times its first
    pull would otherwise time the compiler."""
    from edge_node.wire import compile_decoder

    compile_decoder()


_SESSION_THREADS = 0  # torch's thread count when the session started


def pytest_sessionstart(session: pytest.Session) -> None:
    """Remember the process's own torch thread count before any fixture can change it."""
    import torch

    global _SESSION_THREADS
    _SESSION_THREADS = torch.get_num_threads()
    # A fixed thread count for every run the tests start, in process and in subprocesses: tests compare runs
    # bit for bit (a resumed run with one that was not stopped), and the thread policy (edge_node.torch_threads)
    # would follow the machine's load. The policy's own tests build it directly.
    os.environ.setdefault("OMP_NUM_THREADS", str(_SESSION_THREADS))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test starts and ends with the process's own ``torch`` thread count. An in-process node applies
    its ``threads`` key, and the setting is process-wide: a module-scoped fixture's node sets it before any
    test's set-up (so restoring "the count before the test" kept its 1 for the rest of the session), and a
    later in-process run then sums in another order than the subprocess runs it is compared with, and their
    records differ by float rounding (tests/sim/test_simulate_cli.py's config.json check, on a CPU whose
    kernels split by thread count)."""
    import torch

    if torch.get_num_threads() != _SESSION_THREADS:
        torch.set_num_threads(_SESSION_THREADS)
    yield
    if torch.get_num_threads() != _SESSION_THREADS:
        torch.set_num_threads(_SESSION_THREADS)


@pytest.fixture(autouse=True)
def _kept_channels_closed():
    """Close the channels a test's pulls kept (``edge_node.net.channels``): a test that counts connections
    or descriptors starts from none, as a fresh process would."""
    yield
    channels = sys.modules.get("edge_node.net.channels")
    if channels is not None:
        channels.CHANNELS.close()


@pytest.fixture
def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create private network namespaces")


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Fail a test that leaves non-daemon threads running (servers, browsers, samplers)."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    for t in leaked:
        t.join(timeout=5)
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"test leaked running threads: {still}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("EDGE_NODE_NO_SKIP") == "1" and _skipped:
        print(f"\nEDGE_NODE_NO_SKIP=1 and {len(_skipped)} test(s) were skipped:")
        for nodeid in _skipped:
            print(f"  SKIPPED {nodeid}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
