"""A real terminal for the console tests: a tmux session of a given size running one command.

tmux gives the command a pseudo-terminal (its stdout is a tty, its size is the window's), renders what
it prints as a terminal would (carriage returns, cursor moves: rich's live status line), and lets the
test read the screen (`capture-pane`) and type into it (`send-keys`, C-c sends the terminal's
interrupt character, so the foreground process group gets SIGINT as from a keyboard). Tests skip
without tmux (apt-get install tmux).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import uuid

import pytest


def need_tmux() -> None:
    if shutil.which("tmux") is None or shutil.which("bash") is None:
        pytest.skip("tmux (and bash) are not installed (apt-get install tmux)")


class Terminal:
    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str, width: int = 80, height: int = 40):
        self.name = f"gpuc-{uuid.uuid4().hex[:8]}"
        self.socket = self.name  # a server of its own: closing it touches no other terminal
        # the command, then a pause so its last screen can be read after it ends; its exit code is kept
        self.rc_file = f"/tmp/{self.name}.rc"
        # COLUMNS/LINES of the test's own environment would override the window's size (rich reads them)
        inner = (f"unset COLUMNS LINES; cd {shlex.quote(cwd)} && " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                 + " " + shlex.join(argv) + f"; echo $? > {self.rc_file}; sleep 600")
        # bash, as a login terminal's shell: on Ctrl-C it waits for the command and goes on unless the
        # command itself died of SIGINT (dash would die at once, and the screen with it)
        subprocess.run(self._tmux("new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height),
                                  "bash", "-c", inner), check=True)

    def _tmux(self, *args: str) -> list[str]:
        return ["tmux", "-L", self.socket, *args]

    def screen(self, history: bool = False) -> str:
        extra = ["-S", "-"] if history else []
        out = subprocess.run(self._tmux("capture-pane", "-p", "-t", self.name, *extra), capture_output=True,
                             text=True)
        return out.stdout

    def lines(self, history: bool = False) -> list[str]:
        return [ln.rstrip() for ln in self.screen(history).splitlines()]

    def wait_for(self, pattern: str, timeout: float = 60, history: bool = True) -> re.Match:
        end = time.monotonic() + timeout
        rx = re.compile(pattern, re.M)
        while time.monotonic() < end:
            m = rx.search(self.screen(history))
            if m:
                return m
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} never appeared; the screen:\n{self.screen(True)}")

    def send(self, *keys: str) -> None:
        subprocess.run(self._tmux("send-keys", "-t", self.name, *keys), check=True)

    def exit_code(self, timeout: float = 120) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.path.exists(self.rc_file):
                text = open(self.rc_file).read().strip()
                if text:
                    return int(text)
            time.sleep(0.1)
        raise AssertionError(f"the command did not end; the screen:\n{self.screen(True)}")

    def close(self) -> None:
        subprocess.run(self._tmux("kill-session", "-t", self.name), capture_output=True)
        if os.path.exists(self.rc_file):
            os.remove(self.rc_file)
        subprocess.run(self._tmux("kill-server"), capture_output=True)
