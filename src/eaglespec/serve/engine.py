"""The server's engine: one `Scheduler` stepped on a thread of its own, fed with requests by the
web server's event loop, each request's text streamed back to it as its row accepts tokens.

Everything that touches the scheduler runs on the engine's thread: the event loop only puts
submissions and cancellations in its inbox, and reads each job's events from an asyncio queue
(`Job.events`): ("queued",) once the scheduler took the request, then ("text", pieces, figures)
per round that produced text, and last ("done", finish_reason, figures) or ("error", status,
message).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from eaglespec.decoding.generate import TextStream
from eaglespec.decoding.loop import Request, Row, Scheduler
from eaglespec.errors import EaglespecError
from eaglespec.models.load import Target

log = logging.getLogger("eaglespec.serve")
RATE_WINDOW_S = 10.0  # tokens/s in /metrics: over this many seconds


class QueueFull(Exception):
    """The engine's queue is full: answer 429 and let the client retry."""


@dataclass(eq=False)
class Job:
    """One request in the engine: what to decode, its stop strings, what its drafted tokens are
    called on the page (`source`: "eagle", "lookup", ...), and its events (read on `loop`)."""

    request: Request
    stop: list[str]
    source: str
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() past which it ends with an error
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.monotonic)
    row: Row | None = None
    text: TextStream | None = None
    first_token_s: float | None = None  # seconds from submission to its first text
    counts: Counter = field(default_factory=Counter)  # its tokens by origin

    def post(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening
            pass

    def post_text(self, pieces: list[tuple[str, str | None]]) -> None:
        if pieces:
            self.post("text", [(text, self.origin_name(origin)) for text, origin in pieces], self.figures())

    def figures(self) -> dict:
        """The speculative figures so far (the `eaglespec` field of responses)."""
        stats, tokens = self.request.stats, len(self.text.tokens)
        elapsed = time.monotonic() - self.submitted
        return {"tokens": tokens, "target_forwards": stats.target_forwards,
                "tau": round(tokens / stats.target_forwards, 3) if stats.target_forwards else 0.0,
                "accepted": {self.origin_name(k): v for k, v in self.counts.items()},
                "elapsed_s": round(elapsed, 4), "time_to_first_token_s": self.first_token_s,
                "prefill_s": round(stats.prefill_s, 4), "draft_s": round(stats.draft_s, 4),
                "verify_s": round(stats.verify_s, 4)}

    def origin_name(self, origin: str | None) -> str:
        """An origin as the page names it: a drafted token by the request's drafter."""
        return self.source if origin == "draft" else origin or "target"


@dataclass
class Metrics:
    """Counters for /metrics, written by the engine's thread."""

    requests: dict[str, int] = field(default_factory=dict)  # by outcome
    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_forwards: int = 0  # rows' rounds: generated / forwards is the engine's tau
    accepted: dict[str, int] = field(default_factory=dict)  # generated tokens by origin
    recent: deque = field(default_factory=deque)  # (time, tokens) of the last RATE_WINDOW_S

    def count(self, outcome: str) -> None:
        self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        recent = [(t, n) for t, n in list(self.recent) if t > now - RATE_WINDOW_S]
        return sum(n for _, n in recent) / RATE_WINDOW_S


class Engine:
    """The scheduler and its loop: `run()` steps it until `close()`, on the calling thread, or
    `start()` on a thread of its own. `submit(job)` from the event loop (QueueFull when `max_queue`
    requests already wait), `cancel(job)` when its client went away. A job runs at most
    `timeout_s` seconds from submission.

    Run it on the thread that ran the model before (`eaglespec serve` runs it on the main thread
    and the web server beside it). One token of SmolLM2 took 2.3x longer on a second thread here
    (62 against 140 tokens/s, bf16, 2 cores), as long as on the main thread with libgomp's spinning
    off (GOMP_SPINCOUNT=0): a second thread's OpenMP team makes more OpenMP threads than cores,
    which libgomp seems to answer by spinning less between parallel regions."""

    def __init__(self, target: Target, max_batch: int, max_queue: int, cache_tokens: int, timeout_s: float):
        self.target, self.max_queue, self.timeout_s = target, max_queue, timeout_s
        self.scheduler = Scheduler(target.model, cache_tokens, max_batch)
        self.metrics = Metrics()
        self.jobs: dict[Row, Job] = {}  # the scheduler's rows, queued or decoding
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.unread = 0  # submissions in the inbox
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closed = False
        self.thread: threading.Thread | None = None

    def waiting(self) -> int:
        """Requests not decoding yet."""
        return self.unread + len(self.scheduler.queue)

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.waiting() >= self.max_queue:
                self.metrics.count("rejected")
                raise QueueFull(f"{self.waiting()} requests are waiting already")
            self.unread += 1
        self.inbox.put(("submit", job))
        self.wake.set()

    def cancel(self, job: Job) -> None:
        self.inbox.put(("cancel", job))
        self.wake.set()

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="eaglespec-engine", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def run(self) -> None:
        while not self.closed:
            self._read_inbox()
            self._expire()
            if self.scheduler.idle:
                self.wake.wait(1.0)
                self.wake.clear()
                continue
            try:
                self._step()
            except Exception:  # the server goes on; what failed is in its log, not in any answer
                log.exception("a decoding round failed; its requests end with an error")
                self._fail_all()

    def _step(self) -> None:
        """One round for every active row, and its text to their jobs."""
        rounds = self.scheduler.step()
        now = time.monotonic()
        for row, accepted in rounds:
            self._round(self.jobs[row], accepted)
            self.metrics.recent.append((now, len(accepted)))
        while self.metrics.recent and self.metrics.recent[0][0] < now - RATE_WINDOW_S:
            self.metrics.recent.popleft()
        for row in [row for row in self.jobs if row.done]:
            self._finish(self.jobs.pop(row))

    def _read_inbox(self) -> None:
        while True:
            try:
                kind, job = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "cancel":
                if job.row is not None and self.jobs.pop(job.row, None) is not None:
                    self.scheduler.cancel(job.row)
                    self.metrics.count("cancelled")
                continue
            try:
                job.row = self.scheduler.submit(job.request)
            except EaglespecError as error:
                self.metrics.count("refused")
                job.post("error", 400, str(error))
                continue
            finally:
                with self.lock:
                    self.unread -= 1
            job.text = TextStream(self.target.tokenizer, job.stop)
            self.jobs[job.row] = job
            self.metrics.prompt_tokens += len(job.request.prompt_ids)
            job.post("queued")

    def _expire(self) -> None:
        now = time.monotonic()
        for row, job in list(self.jobs.items()):
            if now > job.deadline:
                del self.jobs[row]
                self.scheduler.cancel(row)
                self.metrics.count("timeout")
                job.post("error", 408, f"the request ran past the server's limit of {self.timeout_s:g} s per "
                                       "request; ask for fewer tokens (max_tokens)")

    def _round(self, job: Job, accepted: list[int]) -> None:
        row, metrics = job.row, self.metrics
        origins = row.origins[len(row.origins) - len(accepted):]
        pieces = job.text.add(accepted, origins)
        if job.text.stopped:  # the stop string's round may keep fewer tokens: count them again, once
            job.counts = Counter(job.text.origins)
        else:
            job.counts.update(origins)
        metrics.generated_tokens += len(accepted)
        metrics.target_forwards += 1
        for origin in origins:
            name = job.origin_name(origin)
            metrics.accepted[name] = metrics.accepted.get(name, 0) + 1
        if job.text.stopped and not row.done:
            row.stats.finish_reason = "stop"
            self.scheduler.cancel(row)
        if pieces and job.first_token_s is None:
            job.first_token_s = round(time.monotonic() - job.submitted, 4)
        job.post_text(pieces)

    def _finish(self, job: Job) -> None:
        job.post_text(job.text.finish())
        self.metrics.count("finished")
        job.post("done", job.row.stats.finish_reason, job.figures())

    def _fail_all(self) -> None:
        for row, job in list(self.jobs.items()):
            self.scheduler.cancel(row)
            self.metrics.count("failed")
            job.post("error", 500, "the server failed while decoding this request")
        self.jobs.clear()
        # a round that failed halfway may have left the cache inconsistent: start a fresh one
        self.scheduler = Scheduler(self.target.model, self.scheduler.cache.capacity, self.scheduler.max_rows)
