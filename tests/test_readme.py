"""The README's "Running the server" block works pasted whole into a shell, first try.

The block is read from README.md itself, so the test follows what a newcomer copies:
it runs in a fresh directory holding only ``.venv`` (this checkout's) and
``.env.example``, the way a clone's root holds them, with free ports given in the
environment (which wins over the ``.env`` the block copies). Both services must answer
``/healthz``; then the shell's whole session is stopped.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from contextlib import suppress
from pathlib import Path

import psutil

from chatlab.harness import ROOT, free_port
from chatlab.setting_names import KNOWN
from tests.support import wait_until

#: long enough for a first start (keys, the hashing pool), on a busy machine
START_S = 60


def readme_block(heading: str) -> str:
    """The first ``sh`` code block after ``heading`` in README.md."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index(f"\n{heading}\n") :]
    start = after.index("```sh\n") + len("```sh\n")
    return after[start : after.index("```", start)]


def _answers(port: int) -> bool:
    with suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
        return True
    return False


def test_the_running_the_server_block_pasted_whole_starts_both_services(tmp_path: Path):
    block = readme_block("## Running the server")
    assert "python -m chat_server" in block and "python -m auth_service &" in block
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    shutil.copy(ROOT / ".env.example", tmp_path / ".env.example")
    edited = (ROOT / ".env.example").read_text() + "# edited by hand\n"
    (tmp_path / ".env").write_text(edited)  # a second paste must not overwrite it
    auth_port, chat_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in KNOWN}
    env.update(AUTH_PORT=str(auth_port), CHAT_PORT=str(chat_port), PYTHONPATH=str(ROOT))
    log_path = tmp_path / "shell.log"
    with log_path.open("wb") as log:
        shell = subprocess.Popen(
            ["bash"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
            start_new_session=True,  # the shell and all it starts: one group to stop
        )
    try:
        assert shell.stdin is not None
        shell.stdin.write(block.encode())
        shell.stdin.close()

        def both_answer() -> bool:
            assert shell.poll() is None, (
                f"the block ended ({shell.returncode}):\n{log_path.read_text()}"
            )
            return _answers(auth_port) and _answers(chat_port)

        asyncio.run(wait_until(both_answer, START_S, log_path.read_text, 0.1))
        assert (tmp_path / "keys" / "jwt_public.pem").is_file()
        assert "JWT_PUBLIC_KEY" not in log_path.read_text()
        assert (tmp_path / ".env").read_text() == edited
    finally:
        _stop_session(shell)
    assert not _answers(auth_port) and not _answers(chat_port)


def _stop_session(shell: subprocess.Popen[bytes]) -> None:
    """SIGTERM the shell's process group and wait for its processes; SIGKILL what is left."""
    try:
        leader = psutil.Process(shell.pid)
        processes = [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        processes = []
    with suppress(ProcessLookupError):
        os.killpg(shell.pid, signal.SIGTERM)
    psutil.wait_procs(processes, timeout=30)
    with suppress(ProcessLookupError):
        os.killpg(shell.pid, signal.SIGKILL)
    shell.wait(10)


def test_the_readme_names_every_debian_package_setup_installs():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    packages = re.search(r'^DEB_PACKAGES="([^"]+)"', setup, re.MULTILINE)
    assert packages is not None
    readme = " ".join((ROOT / "README.md").read_text().split())
    listed = re.search(r"installs the Debian packages \(`([^`]+)`", readme)
    assert listed is not None
    assert listed.group(1).split() == packages.group(1).split()
