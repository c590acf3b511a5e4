"""`eaglespec bench`: every method on the same prompts, side by side in one process.

Methods in the decoding loop (vanilla, eagle[:TREE], sps[:K], pld[:K]) and, for reference,
transformers' own `generate` (`hf`), with an assistant model (`hf-assisted`) and with prompt
lookup (`hf-pld`), and llama.cpp's server on the same GGUF weights (`llama.cpp`, `llama.cpp-ngram`,
`llama.cpp-draft`, `llama.cpp-eagle3`; see `llamacpp.py`). For each item every method runs all of the item's turns before the next
item starts, in an order that rotates from item to item, so that drifts of the machine spread
evenly; a later turn follows the answer the same method gave before. Each method is warmed up
once first. Generation stops at EOS or `max_new_tokens`.

With `batch_size` B > 1 our methods decode B items at a time together (`loop.Scheduler`, one
target forward per round for all rows), the items' turns in step: a batch's second turns start
when all its first turns are done. Throughput is all new tokens over the batches' wall time; a
row's time runs from its batch's start to its last token (per-token latency, p50 and p95).

Speedup is per turn (a method's tokens/s over vanilla's on the same turn), then the median and
mean over turns. Peak memory is the process's peak resident set while the method ran (every
loaded model included), or the peak CUDA allocation on a GPU.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from eaglespec.bench.datasets import Item, load_items
from eaglespec.decoding.drafters import Artefact, method_help, method_needs, parse_method
from eaglespec.decoding.drafters.draft_model import check_draft_model
from eaglespec.decoding.drafters.prompt_lookup import PromptLookup
from eaglespec.decoding.generate import chat_ids, generate
from eaglespec.decoding.loop import Request, Row, Scheduler
from eaglespec.decoding.model import load
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.export import LLAMA_CPP_FILE, export_head
from eaglespec.models.llamacpp import PEERS, LlamaServer, peer_gguf, programs, tau
from eaglespec.models.machine import machine
from eaglespec.models.registry import cache_root
from eaglespec.timing import Clock

REFERENCES = ("hf", "hf-assisted", "hf-pld")
EXTERNAL = REFERENCES + tuple(PEERS)  # methods outside our decoding loop
BASELINES = ("hf", "hf-assisted", "llama.cpp")  # every method's speedup over these too, when they ran
HF_PLD_TOKENS = PromptLookup.num_tokens  # hf-pld drafts as many tokens as our pld
PARTS = ("prefill", "draft", "verify", "other")  # where a generation's time goes


def eagle3_gguf(head_spec: str, target) -> Path:
    """An EAGLE-3 head (a folder, "default" or "eagle3") for a loaded target as llama.cpp's GGUF, in the
    target's dtype (bf16 or f32), kept in the cache under its content's hash for the server to read."""
    cache = cache_root() / "llama.cpp" / "gguf"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:  # beside the cache: the rename stays on one disk
        dtype = "float32" if target.model.weight_like.dtype == torch.float32 else "bfloat16"
        export_head(head_spec, target, "llama.cpp", Path(tmp) / "head", gguf_dtype=dtype)
        made = Path(tmp) / "head" / LLAMA_CPP_FILE
        out = cache / f"eagle3-{hashlib.sha256(made.read_bytes()).hexdigest()[:16]}.gguf"
        os.replace(made, out)
    return out


@dataclass(frozen=True)
class BenchConfig:
    model: str
    dataset: str
    methods: tuple[str, ...]
    head: str | None = "default"
    draft_model: str | None = None
    medusa_head: str | None = "default"
    limit: int | None = 10
    temperature: float = 0.0
    max_new_tokens: int = 128
    dtype: str = "bfloat16"
    weights: str = "dense"  # or int8 / int4 (the target's and the draft model's)
    device: str = "cpu"
    seed: int = 0
    batch_size: int = 1


@dataclass
class Run:
    """One method on one turn."""

    item: str
    turn: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    tau: float | None  # tokens per target forward; None where unknown (hf-assisted, hf-pld)
    token_ids: list[int]
    target_forwards: int | None = None  # rounds; None for the references
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    accepted_lengths: list[int] = field(default_factory=list)
    acceptance_by_depth: list[float] = field(default_factory=list)
    tree: str | None = None
    chain: bool = False  # the draft is a chain: acceptance by depth is n-alpha
    sources: dict[str, int] | None = None  # accepted draft tokens by source (hybrid)


def check_methods(methods: tuple[str, ...], draft_model: str | None, batch_size: int = 1) -> None:
    """Refuse unknown methods and missing draft models before anything is loaded."""
    if batch_size < 1:
        raise InvalidArgumentError(f"--batch-size must be >= 1, got {batch_size}")
    if batch_size > 1 and (outside := [m for m in methods if m in EXTERNAL]):
        raise InvalidArgumentError(f"{', '.join(outside)} decode one prompt at a time here; drop them or use "
                                   "--batch-size 1")
    if not methods:
        raise InvalidArgumentError(f"no methods given: expected a comma-separated list of {method_help()} | "
                                   f"{' | '.join(EXTERNAL)}")
    if len(set(methods)) != len(methods):
        raise InvalidArgumentError(f"a method is listed twice in {','.join(methods)}")
    for spec in methods:
        if spec in EXTERNAL:
            needs_draft = spec in ("hf-assisted", "llama.cpp-draft")
        else:
            try:
                needs_draft = method_needs(spec) is Artefact.DRAFT_MODEL
            except InvalidArgumentError as err:
                raise InvalidArgumentError(f"{err} | {' | '.join(EXTERNAL)}") from None
        if needs_draft and not draft_model:
            raise InvalidArgumentError(
                f"method '{spec}' needs a draft model with the target's tokenizer: pass --draft-model")
    if set(methods) & set(PEERS):
        programs()  # built, or a one-line error with the command that builds it


class Bench:
    """Loads what the methods need, checks every method against the model, then runs."""

    def __init__(self, config: BenchConfig):
        methods = config.methods if "vanilla" in config.methods else ("vanilla", *config.methods)
        self.config = BenchConfig(**(asdict(config) | {"methods": methods}))
        check_methods(methods, config.draft_model, config.batch_size)
        self.items = load_items(config.dataset, config.limit)
        needs = {method_needs(m) if m not in EXTERNAL else m for m in methods}
        model = load(config.model, config.head if Artefact.EAGLE_HEAD in needs else None, config.dtype, config.device,
                     config.draft_model if needs & {Artefact.DRAFT_MODEL, "hf-assisted"} else None, config.weights,
                     config.medusa_head if Artefact.MEDUSA_HEAD in needs else None)
        self.target, self.draft = model.target, model.draft
        if self.draft:
            check_draft_model(self.target, self.draft)
        self.model = model
        self.ours = self._our_methods()
        self.hf = self.hf_draft = None
        if needs & set(REFERENCES):
            self.hf = _hf_model(self.target.folder, config.dtype, config.device)
        if "hf-assisted" in needs:
            self.hf_draft = _hf_model(self.draft.folder, config.dtype, config.device)
        drafts = {}  # the peers' drafters, converted (a head refused) before any server starts
        if "llama.cpp-draft" in methods:
            drafts["llama.cpp-draft"] = peer_gguf(config.draft_model, config.weights, config.dtype)
        if "llama.cpp-eagle3" in methods:
            drafts["llama.cpp-eagle3"] = eagle3_gguf(config.head, self.target)
        self.peers = {m: LlamaServer(m, peer_gguf(config.model, config.weights, config.dtype), torch.get_num_threads(),
                                     drafts.get(m)) for m in methods if m in PEERS}

    def _our_methods(self) -> dict:
        """One object per listed method of ours, even where two specs name the same one (eagle, eagle:auto)."""
        m = self.model
        return {spec: parse_method(spec, **m.artefacts) for spec in self.config.methods
                if spec not in EXTERNAL}

    def close(self) -> None:
        """Stops the llama.cpp servers (they also stop when the process exits)."""
        for server in self.peers.values():
            server.stop()

    def run_one(self, spec: str, ids: list[int], max_new_tokens: int, seed: int) -> Run:
        c = self.config
        if spec in PEERS:
            out = self.peers[spec].complete(ids, max_new_tokens, c.temperature, seed)
            n = len(out["token_ids"])
            return Run("", 0, n, out["seconds"], n / out["seconds"], tau(n, out["timings"]), out["token_ids"])
        if spec in REFERENCES:
            return self._run_hf(spec, ids, max_new_tokens, seed)
        out = generate(self.target, ids, method=self.ours[spec], max_new_tokens=max_new_tokens,
                       temperature=c.temperature, seed=seed)
        return Run("", 0, out.new_tokens, out.seconds, out.tokens_per_s, out.tau, out.token_ids,
                   out.target_forwards, out.prefill_s, out.draft_s, out.verify_s, out.other_s,
                   out.accepted_lengths or [], out.acceptance_by_depth or [], out.tree, out.n_alpha is not None,
                   out.sources)

    @torch.inference_mode()
    def _run_hf(self, spec: str, ids: list[int], max_new_tokens: int, seed: int) -> Run:
        from transformers import GenerationConfig

        c = self.config
        eos = sorted(self.target.eos_token_ids)
        sampling = {"do_sample": True, "temperature": c.temperature, "top_k": 0, "top_p": 1.0} \
            if c.temperature > 0 else {"do_sample": False}
        lookup = {"prompt_lookup_num_tokens": HF_PLD_TOKENS} if spec == "hf-pld" else {}
        settings = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos[0],
                                    **sampling, **lookup)
        extra = {"assistant_model": self.hf_draft} if spec == "hf-assisted" else {}
        torch.manual_seed(seed)
        device = self.target.model.embed.weight.device
        clock = Clock(device)
        out = self.hf.generate(torch.tensor([ids], device=device), generation_config=settings, **extra)
        seconds = clock.lap()
        tokens = out[0, len(ids):].tolist()
        return Run("", 0, len(tokens), seconds, len(tokens) / seconds, 1.0 if spec == "hf" else None, tokens)

    def run(self, progress: bool = True) -> dict:
        c = self.config
        methods = list(c.methods)
        first = chat_ids(self.target, [{"role": "user", "content": self.items[0].turns[0]}], paragraphs=True)
        for spec in methods:  # warm-up: first-call set-up is not timed
            self.run_one(spec, first, 16, c.seed)
        self.ours = self._our_methods()  # what the warm-up taught them (a suffix cache: the first answer) is not kept
        runs: dict[str, list[Run]] = {m: [] for m in methods}
        peaks = dict.fromkeys(methods, 0.0)
        walls = dict.fromkeys(methods, 0.0)  # seconds the batches took (one item at a time: the runs')
        turns = sum(len(item.turns) for item in self.items)
        bar = tqdm(total=turns * len(methods), desc=f"bench {c.dataset}", unit="turn", disable=not progress)
        B = c.batch_size
        for g in range(0, len(self.items), B):
            group, i = self.items[g:g + B], g // B
            for spec in methods[i % len(methods):] + methods[: i % len(methods)]:
                bar.set_postfix_str(spec)
                peer = self.peers.get(spec)
                peer.reset_peak() if peer else _reset_peak(self.target.model.embed.weight.device)
                if B == 1:
                    done = self._conversation(spec, group[0], c.seed + g)
                    walls[spec] += sum(r.seconds for r in done)
                else:
                    done, wall = self._batch(spec, group, c.seed + g)
                    walls[spec] += wall
                runs[spec].extend(done)
                peak = peer.peak_mb() if peer else _peak_mb(self.target.model.embed.weight.device)
                peaks[spec] = max(peaks[spec], peak)
                bar.update(len(done))
        bar.close()
        return report(c, runs, peaks, len(self.items), walls)

    def _batch(self, spec: str, items: list[Item], seed: int) -> tuple[list[Run], float]:
        """Our method `spec` on a batch of items decoded together, turn by turn: the runs, and
        the wall time of the batch. Item k samples with seed + k, as it does alone."""
        c, target = self.config, self.target
        method = self.ours[spec]
        messages: list[list[dict]] = [[] for _ in items]
        out: list[list[Run]] = [[] for _ in items]  # per item, as one at a time gives them
        wall = 0.0
        for turn in range(max(len(item.turns) for item in items)):
            live = [k for k, item in enumerate(items) if turn < len(item.turns)]
            rows = []
            for n, k in enumerate(live):
                messages[k].append({"role": "user", "content": items[k].turns[turn]})
                params = SamplingParams(temperature=c.temperature, seed=seed + k)
                request = Request(chat_ids(target, messages[k], paragraphs=True), params, c.max_new_tokens, target.eos_token_ids,
                                  method.bind(target, params) if method else None)
                rows.append(Row(target.model, request, n))
            clock, finished = Clock(target.model.embed.weight.device), {}
            scheduler = Scheduler(target.model, sum(row.slots for row in rows), len(rows))
            for row in rows:
                scheduler.enqueue(row)
            elapsed = 0.0
            while not scheduler.idle:
                scheduler.step()
                elapsed += clock.lap()
                finished.update((row.id, elapsed) for row in rows if row.done and row.id not in finished)
            wall += elapsed
            for row, k in zip(rows, live):
                stats, seconds, drafter = row.stats, finished[row.id], row.drafter
                parts = stats.prefill_s + stats.draft_s + stats.verify_s
                out[k].append(Run(items[k].id, turn, len(row.tokens), seconds, len(row.tokens) / seconds, stats.tau,
                               row.tokens, stats.target_forwards, stats.prefill_s, stats.draft_s, stats.verify_s,
                               max(seconds - parts, 0.0), stats.accepted_lengths, stats.acceptance_by_depth(),
                               drafter.describe() if drafter else None, bool(drafter and drafter.shape.chain),
                               stats.sources or None))
                answer = target.tokenizer.decode(row.tokens, skip_special_tokens=True)
                messages[k].append({"role": "assistant", "content": answer})
        return [run for runs in out for run in runs], wall

    def _conversation(self, spec: str, item: Item, seed: int) -> list[Run]:
        messages, out = [], []
        for turn, text in enumerate(item.turns):
            messages.append({"role": "user", "content": text})
            run = self.run_one(spec, chat_ids(self.target, messages, paragraphs=True), self.config.max_new_tokens, seed)
            run.item, run.turn = item.id, turn
            out.append(run)
            answer = self.target.tokenizer.decode(run.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
        return out


def report(config: BenchConfig, runs: dict[str, list[Run]], peaks: dict[str, float], items: int,
           walls: dict[str, float]) -> dict:
    """The JSON written by `eaglespec bench`: settings, a summary per method, every run."""
    vanilla = runs["vanilla"]
    methods = {}
    for spec, rs in runs.items():
        seconds = sum(r.seconds for r in rs)
        tokens = sum(r.new_tokens for r in rs)
        latency = sorted(1000 * r.seconds / r.new_tokens for r in rs if r.new_tokens)
        ratios = [r.tokens_per_s / v.tokens_per_s for r, v in zip(rs, vanilla)]
        rounds = None if spec in EXTERNAL else sum(r.target_forwards for r in rs)
        summary = {
            "tokens_per_s": tokens / seconds,
            "tokens_per_s_median": statistics.median(r.tokens_per_s for r in rs),
            "speedup": statistics.median(ratios),
            "speedup_mean": statistics.mean(ratios),
            "tau": _external_tau(rs) if rounds is None else tokens / rounds,
            "new_tokens": tokens,
            "seconds": seconds,
            "peak_memory_mb": peaks[spec],
            "throughput_tokens_per_s": tokens / walls[spec],  # with batch_size 1 the same as tokens_per_s
            "throughput_speedup": tokens / walls[spec] / (sum(r.new_tokens for r in vanilla) / walls["vanilla"]),
            "ms_per_token_p50": statistics.median(latency),
            "ms_per_token_p95": latency[min(len(latency) - 1, round(0.95 * (len(latency) - 1)))],
        }
        for base in BASELINES:
            if base in runs and base != spec:
                summary[f"speedup_vs_{base}"] = statistics.median(
                    r.tokens_per_s / b.tokens_per_s for r, b in zip(rs, runs[base]))
        if spec not in EXTERNAL:
            parts = {k: sum(getattr(r, f"{k}_s") for r in rs) for k in PARTS}
            summary["time_split"] = {k: t / seconds for k, t in parts.items()}
            summary["round_ms"] = {k: 1000 * parts[k] / rounds for k in ("draft", "verify", "other")}
        if spec not in EXTERNAL and spec != "vanilla":
            summary["tree"] = rs[-1].tree
            depth = max(len(r.acceptance_by_depth) for r in rs)
            by_depth = [statistics.mean(r.acceptance_by_depth[d] for r in rs if len(r.acceptance_by_depth) > d)
                        for d in range(depth)]
            summary["n_alpha" if rs[0].chain else "acceptance_by_depth"] = by_depth
        if any(r.sources for r in rs):
            names = sorted({k for r in rs if r.sources for k in r.sources})
            summary["accepted_by_source"] = {k: sum(r.sources.get(k, 0) for r in rs if r.sources) for k in names}
        if config.temperature == 0:
            summary["same_tokens_as_vanilla"] = sum(r.token_ids == v.token_ids for r, v in zip(rs, vanilla))
        summary["runs"] = [asdict(r) for r in rs]
        methods[spec] = summary
    best = {}
    for spec, s in methods.items():
        family = spec.split(":")[0]
        if family not in best or s["speedup"] > methods[best[family]]["speedup"]:
            best[family] = spec
    return {"config": asdict(config), "machine": machine(config.device), "items": items,
            "turns": len(vanilla), "methods": methods, "best": best}


def markdown(result: dict) -> str:
    """The summary as a Markdown table."""
    c = result["config"]
    methods = result["methods"]
    refs = [b for b in BASELINES if b in methods]
    batched = c.get("batch_size", 1) > 1
    head = ["method", "tokens/s", "speedup (median)", "speedup (mean)", *(f"vs {b}" for b in refs), "tau",
            "0/1/2-alpha (chains)", "peak MiB"]
    head[1:1] = ["throughput tokens/s", "throughput speedup", "ms/token p50 / p95"] if batched else []
    batches = f", batches of {c['batch_size']}" if batched else ""
    title = (f"{c['model']} on {c['dataset']} ({result['items']} items, {result['turns']} turns), "
             f"temperature {c['temperature']:g}, max {c['max_new_tokens']} new tokens, {c['dtype']}"
             f"{'' if c.get('weights', 'dense') == 'dense' else ' with ' + c['weights'] + ' weights'}, "
             f"{result['machine']['threads']} threads{batches}")
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, s in methods.items():
        cells = [spec, *([f"{s['throughput_tokens_per_s']:.1f}", f"{s['throughput_speedup']:.2f}x",
                          f"{s['ms_per_token_p50']:.1f} / {s['ms_per_token_p95']:.1f}"] if batched else []),
                 f"{s['tokens_per_s']:.1f}", f"{s['speedup']:.2f}x", f"{s['speedup_mean']:.2f}x",
                 *(f"{s[f'speedup_vs_{b}']:.2f}x" if f"speedup_vs_{b}" in s else "1.00x" for b in refs),
                 "-" if s["tau"] is None else f"{s['tau']:.2f}",
                 " / ".join(f"{a:.2f}" for a in s["n_alpha"][:3]) if "n_alpha" in s else "-",
                 f"{s['peak_memory_mb']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", ("Where the time goes: share of the whole generation, then milliseconds per round "
                   "(one target forward)"), "",
              "| method | prefill | draft | verify | other | ms/round: draft | verify | other |",
              "|" + "---|" * 8]
    for spec, s in methods.items():
        if "time_split" in s:
            split, ms = s["time_split"], s["round_ms"]
            lines.append(f"| {spec} | " + " | ".join(f"{split[k]:.0%}" for k in PARTS) + " | "
                         + " | ".join(f"{ms[k]:.1f}" for k in ("draft", "verify", "other")) + " |")
    return "\n".join(lines)


def _external_tau(runs: list[Run]) -> float | None:
    """Tokens per target forward over all turns of a method outside our loop: hf 1, llama.cpp from
    its accepted draft counts, hf-assisted and hf-pld unknown (None)."""
    if any(r.tau is None for r in runs):
        return None
    forwards = sum(r.new_tokens / r.tau for r in runs if r.new_tokens)
    return sum(r.new_tokens for r in runs) / forwards if forwards else 1.0


def _hf_model(folder: Path, dtype: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype)).to(device).eval()


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets the peak resident set (Linux)
        except OSError:
            pass


def _peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024
