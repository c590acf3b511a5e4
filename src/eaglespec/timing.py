"""Wall-clock laps that wait for the device, so that each lap is the work done in it, and the
clock that training budgets count."""

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


def work_seconds(device: torch.device | str = "cpu") -> float:
    """The clock that training budgets and extraction costs count. On a CPU: the process's CPU time
    per thread, which equals wall time on a quiet machine and does not count the time other
    processes take from it (or a stopped process's pause), so work that shares the CPU is still
    measured fairly; on a GPU: wall time."""
    if torch.device(device).type == "cuda":
        return time.monotonic()
    return time.process_time() / torch.get_num_threads()
