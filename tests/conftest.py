"""Shared pytest fixtures, and the groups that keep the suite sound under pytest-xdist (`-n 2 --dist loadgroup`,
pyproject's addopts)."""
from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

T = TypeVar("T")

# --- one worker per lab (pytest-xdist) ---------------------------------------------------------------------------

# Each lab is one per machine: the sshd nodes hold 127.0.0.2..4 port 22, and a node stopped by one test must not be
# another worker's lost node mid-run; the Slurm and Ray labs are too heavy for two at once on two cores. Every test
# that uses a lab, by its fixtures or by `@pytest.mark.lab(FIXTURE)` where it asks for it at run time
# (request.getfixturevalue), goes to the lab's xdist group, so that one worker starts it and runs all its tests.
LAB_GROUPS = {"ssh_nodes": "lab-sshd", "slurm_lab": "lab-slurm", "ray_lab": "lab-ray"}


# The tests that train with real DeepSpeed on this machine's CPU (`@pytest.mark.deepspeed`, outside the labs) take
# one group too: two such runs side by side each take the other's cores in bursts, and a run measured until sure
# then sees steps that swing by more than any tolerance a test can state (a real DeepSpeed tune was not sure within
# 25% over 56 steps beside another). One at a time, each shares the machine with the lighter stand-in tests only.
DEEPSPEED_GROUP = "real-deepspeed"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "lab(fixture): the test asks for a lab's fixture at run time "
                                       "(request.getfixturevalue); it goes to that lab's xdist group")
    config.addinivalue_line("markers", "deepspeed: the test trains with real DeepSpeed on the CPU; outside a lab it "
                                       f"goes to the xdist group {DEEPSPEED_GROUP}, one such test at a time")


def lab_groups(item: pytest.Item) -> set[str]:
    """The xdist groups of the labs `item` uses."""
    named = set(getattr(item, "fixturenames", ())) | {m.args[0] for m in item.iter_markers("lab")}
    return {LAB_GROUPS[name] for name in named if name in LAB_GROUPS}


def module_fixture(item: pytest.Item) -> bool:
    """Whether `item` uses a module- or class-scoped fixture: the tests that share one stay on one worker, which
    sets it up once (a real run, a dashboard) rather than once per worker."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d[-1].scope in ("module", "class") for d in defs)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test that uses a lab joins its lab's group; one that trains with real DeepSpeed, the DeepSpeed group;
    a test of a module-scoped fixture joins its file's."""
    for item in items:
        groups = lab_groups(item)
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses two labs ({', '.join(sorted(groups))}): one worker "
                                    "holds each, so no test may need two")
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups.pop()))
        elif item.get_closest_marker("deepspeed") is not None:
            item.add_marker(pytest.mark.xdist_group(DEEPSPEED_GROUP))
        elif module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(f"file-{item.path.name}"))


class Lazy(Generic[T]):
    """A session's lab, started when a test of its group first asks for it (so a test outside the group fails
    before any lab starts), and stopped at the session's end if it was."""

    def __init__(self, fixture: str, start: Callable[[], AbstractContextManager[T]]) -> None:
        self.fixture, self._start = fixture, start
        self._stack = ExitStack()
        self._lab: T | None = None
        self._failed: BaseException | None = None  # a start that failed fails (or skips) every later test at once

    def get(self, request: pytest.FixtureRequest) -> T:
        in_lab_group(request, self.fixture)
        if self._failed is not None:
            raise self._failed
        if self._lab is None:
            try:
                self._lab = self._stack.enter_context(self._start())
            except BaseException as e:
                self._failed = e
                raise
        return self._lab

    def close(self) -> None:
        self._stack.close()


@contextmanager
def lazy(fixture: str, start: Callable[[], AbstractContextManager[T]]) -> Iterator[Lazy[T]]:
    held = Lazy(fixture, start)
    try:
        yield held
    finally:
        held.close()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller: tell each worker how tests are dealt out (a worker's own `--dist` reads "no")."""
    node.workerinput["autotune_dist"] = node.config.getoption("dist")


def in_lab_group(request: pytest.FixtureRequest, fixture: str) -> None:
    """Fail a test that reaches a lab outside its group (a `request.getfixturevalue` without `@pytest.mark.lab`):
    under xdist, another worker could start the same lab."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:
        return  # not an xdist worker: one process, one lab
    if workerinput.get("autotune_dist") != "loadgroup":
        pytest.fail(f"{request.node.nodeid}: the labs need --dist loadgroup (pyproject's addopts), not "
                    f"--dist {workerinput.get('autotune_dist')}: each lab's tests on one worker")
    marker = request.node.get_closest_marker("xdist_group")
    group = LAB_GROUPS[fixture]
    if marker is None or marker.args[0] != group:
        pytest.fail(f"{request.node.nodeid} reaches the {fixture} lab outside the xdist group {group}: "
                    f"mark it @pytest.mark.lab({fixture!r})")


# --- real sshd nodes on loopback (tests/sshnodes.py) -------------------------------------------------------------

@contextmanager
def _started_ssh_nodes(root: Path) -> Iterator[Any]:
    import sshnodes

    reason = sshnodes.unavailable_reason()
    if reason:
        message = f"no sshd test nodes: {reason} (.ci/setup-tests installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs them: a skip there would hide a broken setup
        pytest.skip(message)
    nodes = sshnodes.start_nodes(3, root)
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture(scope="session")
def _ssh_nodes_lazy(tmp_path_factory):
    with lazy("ssh_nodes", lambda: _started_ssh_nodes(tmp_path_factory.mktemp("sshnodes"))) as held:
        yield held


@pytest.fixture
def ssh_nodes(_ssh_nodes_lazy, request):
    """Three real sshd nodes, `node-1`..`node-3` on 127.0.0.2..4 (port 22 unless taken), started once per session
    and all up again at the start of every test (a test may `stop()` one to simulate a lost node).

    `ssh_nodes.config_path` is an ssh config naming them (use with `ssh -F`, `SSHPool(ssh_nodes.config_path)`,
    or pdsh with `ssh_nodes.pdsh_env()`); `ssh_nodes.known_hosts_path` holds their host keys;
    `ssh_nodes["node-2"]` / `ssh_nodes[1]` is a `sshnodes.Node` with `.stop()`, `.start()`, `.address`, `.port`.
    """
    nodes = _ssh_nodes_lazy.get(request)
    nodes.start()
    return nodes


# --- background `autotune` processes (tests/cli_rig.py) ---------------------------------------------------------

@pytest.fixture
def runners():
    """`cli_rig.Runners`: the test's background `autotune` processes, whatever is left of them killed at the end."""
    from cli_rig import Runners

    r = Runners()
    yield r
    r.cleanup()


# --- a real Slurm cluster on this machine (tests/slurm_lab.py) --------------------------------------------------

@contextmanager
def _started_slurm_lab(root: Path) -> Iterator[Any]:
    import slurm_lab

    reason = slurm_lab.unavailable_reason()
    if reason:
        pytest.fail(f"no Slurm lab: {reason} (.ci/setup-tests installs it)")
    with slurm_lab.SlurmLab(root) as lab:  # started, and stopped at the end
        yield lab


@pytest.fixture(scope="session")
def _slurm_lab_lazy(tmp_path_factory):
    with lazy("slurm_lab", lambda: _started_slurm_lab(tmp_path_factory.mktemp("slurm"))) as held:
        yield held


@pytest.fixture
def slurm_lab(_slurm_lab_lazy, request):
    """A real Slurm cluster, started once per session: nodes `n1`..`n3` (CPUs=2, Gres=gpu:2 each, fake GPUs that
    set CUDA_VISIBLE_DEVICES), partition `debug`. Pass `slurm_lab.env` to every Slurm command (SLURM_CONF).
    Helpers: `allocate(nodes, gpus_per_node, *salloc_args) -> job id`, `release(job)`, `steps(job)`,
    `drain(node)`, `resume_node(node)`, `down(node)` / `start_node(node)`, `node_state(node)`, `run(*args)`.
    A test leaves what it changed as it found it (its jobs released, its nodes resumed).

    A missing Slurm fails, never skips: .ci/setup-tests installs it.
    """
    return _slurm_lab_lazy.get(request)


# --- a real Ray cluster on this machine (tests/ray_lab.py) ------------------------------------------------------

@pytest.fixture(scope="session")
def _ray_lab_lazy():
    import ray_lab as lab

    with lazy("ray_lab", lab.running) as held:
        yield held


@pytest.fixture
def ray_lab(_ray_lab_lazy, request):
    """A real Ray cluster, started once per session: a head and two worker nodes, two fake GPUs each, on
    loopback. Pass `ray_lab.env` to every `autotune --ray` (RAY_ADDRESS, and Ray kept on loopback). The test
    process is connected too: `placement_groups()`, `actors(prefix)`, `alive()`, `kill_worker(i)`."""
    return _ray_lab_lazy.get(request)


@pytest.fixture
def silent_ssh(tmp_path):
    """An ssh config that sends localhost and 127.0.0.1 to a port where nothing listens (a bound socket that
    never listens refuses every connection), so no test depends on this machine's own sshd."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        config = tmp_path / "ssh_config"
        config.write_text(f"Host localhost 127.0.0.1\n  HostName 127.0.0.1\n  Port {sock.getsockname()[1]}\n"
                          "  ConnectTimeout 5\n")
        yield config
