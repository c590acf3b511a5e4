"""Wall-clock laps that wait for the device, so that each lap is the work done in it."""

from __future__ import annotations

import time

import torch


class Clock:
    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.last = self.now()

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        """Seconds since the previous lap (or since the clock was made)."""
        now = self.now()
        elapsed, self.last = now - self.last, now
        return elapsed
