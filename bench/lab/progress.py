"""The lab's progress bar: what runs now, how far along, and roughly how long is left.

On a terminal a tqdm bar counts estimated seconds; elsewhere (CI, a pipe) one line per
phase and per finished run, so a log still shows where the lab is.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from tqdm import tqdm

from bench.lab.results import Run


class Progress:
    """A bar over the matrix's estimated seconds, advanced by the clock."""

    def __init__(self, total_s: float, title: str, enabled: bool = True) -> None:
        self.total_s = max(1.0, total_s)
        self.t0 = time.monotonic()
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.bar: Any = None
        if self.tty:
            self.bar = tqdm(
                total=round(self.total_s),
                desc=title,
                unit="s",
                bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}]",
                dynamic_ncols=True,
            )
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        elif enabled:
            print(f"{title}: about {self.total_s / 60:.1f} min", file=sys.stderr, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            elapsed = time.monotonic() - self.t0
            if elapsed > self.bar.total:
                self.bar.total = round(elapsed + 5)
            self.bar.n = round(elapsed)
            self.bar.refresh()

    def phase(self, text: str) -> None:
        """Say what runs now."""
        if self.bar is not None:
            self.bar.set_description_str(text, refresh=True)
        elif self.enabled:
            elapsed = time.monotonic() - self.t0
            print(f"[{elapsed:5.0f} s / ~{self.total_s:.0f} s] {text}", file=sys.stderr, flush=True)

    def done_run(self, run: Run, seconds: float) -> None:
        """One line about a finished run."""
        if not self.enabled:
            return
        parts = [f"{run.config} #{run.repeat + 1}: {run.status} in {seconds:.0f} s"]
        for step in run.steps:
            mark = " (generator-limited)" if step.generator_limited else ""
            cost = step.server_us_per_frame
            cost_text = f", server {cost:.1f} µs/frame" if cost is not None else ""
            parts.append(
                f"{step.driver} {step.name}: {step.delivered_per_s:,.0f} delivered/s, "
                f"p99 {step.latency_ms.get('p99', 0):.1f} ms{cost_text}{mark}"
            )
        if run.error:
            parts.append(run.error.strip().splitlines()[-1][:200])
        line = "\n    ".join(parts)
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Finish the bar."""
        if self.bar is not None:
            self._stop.set()
            self.bar.n = self.bar.total
            self.bar.close()
