"""`eaglespec serve` under load: requests/s, output tokens/s, time to first token and time per
output token (p50 / p95) with each method at 1, 4 and 16 concurrent streaming clients, all on one
server (each request names its method), greedy. Each level asks 16 MT-bench first turns of its
own (all methods the same ones), so no method sees a prompt twice.

    .venv/bin/python benchmarks/experiments/serve_load.py smollm2-135m-instruct --out benchmarks/results/serve-MACHINE.json

The clients run in this process beside the server (2 cores here: the clients' share of the CPU is
part of what is measured). Stop other work while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from common import machine, write_json  # noqa: E402
from eaglespec.bench.datasets import load_items  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one(http: httpx.AsyncClient, model: str, prompt: str, method: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "method": method}
    start, first, last, figures = time.perf_counter(), None, None, None
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
            figures = chunk.get("eaglespec", figures)
    tokens = figures["tokens"]
    return {"tokens": tokens, "tau": figures["tau"], "ttft_s": first - start, "seconds": last - start,
            "tpot_s": (last - first) / (tokens - 1) if tokens > 1 else None}


async def level(url: str, model: str, prompts: list[str], method: str, clients: int, max_tokens: int) -> dict:
    """Every prompt once, `clients` requests in flight at a time."""
    todo = list(prompts)
    results = []

    async def worker(http):
        while todo:
            results.append(await one(http, model, todo.pop(0), method, max_tokens))

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        start = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(clients)))
        wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    tpots = [r["tpot_s"] for r in results if r["tpot_s"] is not None]
    ttfts = [r["ttft_s"] for r in results]
    return {"method": method, "clients": clients, "requests": len(results), "wall_s": round(wall, 3),
            "requests_per_s": round(len(results) / wall, 3), "output_tokens_per_s": round(tokens / wall, 2),
            "tau": round(statistics.mean(r["tau"] for r in results), 3),
            "ttft_ms_p50": round(1000 * percentile(ttfts, 0.5), 1), "ttft_ms_p95": round(1000 * percentile(ttfts, 0.95), 1),
            "tpot_ms_p50": round(1000 * percentile(tpots, 0.5), 1), "tpot_ms_p95": round(1000 * percentile(tpots, 0.95), 1),
            "output_tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--methods", default="vanilla,eagle")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=16, help="MT-bench first turns per level (each method asks them all)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--serve-args", default="", help="more `eaglespec serve` options, e.g. '--threads 1'")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    # each level its own prompts, and the warm-up others again: `hybrid` keeps a cache of earlier
    # answers (its suffix source), which a prompt asked twice would find
    prompts = [item.turns[0] for item in load_items("mt-bench", args.requests * len(levels) + 2)]
    if len(prompts) < args.requests * len(levels) + 2:
        raise SystemExit(f"MT-bench has {len(prompts)} first turns: ask for fewer --requests")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "eaglespec.cli", "serve", "--model", args.model, "--port", str(port),
                               "--max-batch", str(args.max_batch), "--max-queue", "64", *args.serve_args.split()],
                              env={k: v for k, v in os.environ.items() if k != "EAGLESPEC_API_KEY"})
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            raise SystemExit("the server did not start")
        rows = []
        for method in args.methods.split(","):  # warm-up: first calls pay one-off costs
            asyncio.run(level(url, args.model, prompts[-2:], method, 1, 16))
        for k, clients in enumerate(levels):
            asked = prompts[k * args.requests:(k + 1) * args.requests]
            for method in args.methods.split(","):
                rows.append(asyncio.run(level(url, args.model, asked, method, clients, args.max_tokens)))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        server.terminate()
        server.wait()
    plain = {r["clients"]: r["output_tokens_per_s"] for r in rows if r["method"] == "vanilla"}
    for r in rows:
        r["throughput_vs_vanilla"] = round(r["output_tokens_per_s"] / plain[r["clients"]], 3) if r["clients"] in plain else None
    write_json({"model": args.model, "dataset": "mt-bench (first turns, 16 of its own per level)", "max_tokens": args.max_tokens,
                "max_batch": args.max_batch, "dtype": "bfloat16", "temperature": 0.0, "rows": rows,
                "machine": machine()}, args.out)
    print("| clients | method | requests/s | output tokens/s (vs vanilla) | tau | TTFT p50 / p95 ms | time per token p50 / p95 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clients']} | {r['method']} | {r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f} ({r['throughput_vs_vanilla'] or 0:.2f}x) | {r['tau']:.2f} "
              f"| {r['ttft_ms_p50']:.0f} / {r['ttft_ms_p95']:.0f} | {r['tpot_ms_p50']:.1f} / {r['tpot_ms_p95']:.1f} |")


if __name__ == "__main__":
    main()
