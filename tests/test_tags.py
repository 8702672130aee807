"""Finding an attempt's processes by the exact tag in their environment, here and through the shell snippets."""
import os
import signal
import subprocess
import time

import pytest

from autotuner.backends import tags

# Tags unique to this test process: another test run on the machine must not see our processes, nor we its.
P = f"t{os.getpid()}"


@pytest.fixture
def tagged():
    """Two sleepers tagged s.e.1 (one in a new session, as a daemonizing child would be) and one tagged s.e.10."""
    procs = []

    def start(tag, **kw):
        proc = subprocess.Popen(["sleep", "60"], env={**os.environ, tags.TAG_ENV: tag}, **kw)
        procs.append(proc)
        # Popen returns once exec has begun; on a loaded machine /proc/PID/environ can still be empty for a
        # moment after that (seen once in CI): the tests are about finding a process that carries its tag.
        deadline = time.monotonic() + 10
        while not tags.carries(proc.pid, tag) and time.monotonic() < deadline:
            time.sleep(0.01)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_exact_tag_only(tagged):
    a, b = tagged(f"{P}.e.1"), tagged(f"{P}.e.1", start_new_session=True)
    other = tagged(f"{P}.e.10")
    assert tags.find_tagged(f"{P}.e.1") == sorted([a.pid, b.pid])
    assert tags.find_tagged(f"{P}.e.10") == [other.pid]
    assert tags.find_tagged(f"{P}.e") == []


def test_shell_snippets_agree_with_the_local_scan(tagged):
    a = tagged(f"{P}.x.1")
    tagged(f"{P}.x.11")
    found = subprocess.run(["sh", "-c", tags.find_command(f"{P}.x.1")], capture_output=True, text=True).stdout
    assert found.split() == [str(a.pid)]
    killed = subprocess.run(["sh", "-c", tags.kill_command(f"{P}.x.1")], capture_output=True, text=True).stdout
    assert killed.split() == [str(a.pid)]
    assert a.wait(5) == -signal.SIGKILL
    assert tags.find_tagged(f"{P}.x.1") == [] and len(tags.find_tagged(f"{P}.x.11")) == 1


def test_signal_tagged_reaches_processes_outside_the_group(tagged):
    escaped = tagged(f"{P}.y.1", start_new_session=True)
    assert tags.signal_tagged(f"{P}.y.1", signal.SIGTERM) == [escaped.pid]
    assert escaped.wait(5) == -signal.SIGTERM


@pytest.mark.parametrize("bad", ["a b", "x;rm -rf /", "$(id)", "", "a'b"])
def test_tags_that_would_need_quoting_are_refused(bad):
    with pytest.raises(ValueError):
        tags.check_tag(bad)
