"""Other processes' CPU, counted process by process: a busy process outside the lab's tree
is "others", a busy child inside it (and one that ended inside the window) is "ours", and
what the host counts beyond both is nobody's (docs/decisions/0018-other-processes.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.lab.machine import CpuSplit, cpu_split, load_between

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"
#: the window each case reads; a busy loop gets at least a third of a core in it even on
#: a shared 2-core machine
WINDOW_S = 1.5


def _split_over(seconds: float) -> tuple[CpuSplit, CpuSplit]:
    me = psutil.Process()
    before = cpu_split([me])
    time.sleep(seconds)
    return before, cpu_split([me])


@pytest.fixture
def orphan(tmp_path: Path) -> Iterator[int]:
    """A busy loop outside this process' tree: started by a shell that exits at once, so
    that init adopts it. Its pid; killed after the test."""
    pid_file = tmp_path / "pid"
    script = BUSY.format(s=30)
    subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$0" & echo $! > {pid_file}', script],
        check=True,
        timeout=10,
    )
    pid = int(pid_file.read_text())  # the shell wrote it before it exited
    yield pid
    os.kill(pid, signal.SIGKILL)


def test_a_busy_process_outside_the_tree_is_other_processes(orphan: int) -> None:
    assert orphan not in {p.pid for p in psutil.Process().children(recursive=True)}
    os.sched_setaffinity(orphan, {0})  # on the server's core, as a neighbour would be
    me, loop = psutil.Process(), psutil.Process(orphan)

    def splits() -> tuple[CpuSplit, CpuSplit, CpuSplit]:
        # the host, and core 0 and core 1 with the loop set apart (as the server would be)
        return cpu_split([me], [0]), cpu_split([me], [1]), cpu_split([me], [0], [loop])

    before = splits()
    time.sleep(WINDOW_S)
    after = splits()
    others = after[0].others_s - before[0].others_s
    ours = after[0].ours_s - before[0].ours_s
    assert others >= WINDOW_S / 3, (others, ours)
    assert ours < others  # this process slept
    load = load_between(before[0], after[0], WINDOW_S)
    assert load is not None and load.others_percent >= 100 / 3
    # counted on the core it may run on, by its own run time; not on the other core, and
    # not when it is the process set apart
    on_core_0, on_core_1, apart = (
        a.on_cores_s - b.on_cores_s for a, b in zip(after, before, strict=True)
    )
    assert on_core_0 >= WINDOW_S / 3, on_core_0
    assert on_core_1 < on_core_0 - WINDOW_S / 4, (on_core_1, on_core_0)
    assert apart < on_core_0 - WINDOW_S / 4, (apart, on_core_0)


def test_a_busy_child_and_one_that_ended_are_ours() -> None:
    me = psutil.Process()
    before = cpu_split([me])
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=WINDOW_S)])
    ended = subprocess.run([sys.executable, "-c", BUSY.format(s=0.5)], check=True, timeout=30)
    assert ended.returncode == 0  # reaped: its time is in this process' children's
    child.wait(timeout=30)
    after = cpu_split([me])
    ours = after.ours_s - before.ours_s
    # the two loops ran ~2 s of wall time between them; each got at least a third of a core
    assert ours >= (WINDOW_S + 0.5) / 3, ours
    assert after.unattributed_s == pytest.approx(after.host.busy_s - after.ours_s - after.others_s)
