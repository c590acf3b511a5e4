"""llama.cpp's EAGLE-3 drafting with our head at several draft settings, to tell a user what to run:
llama-server with the head's GGUF (as `eaglespec export --format llama.cpp` writes it, bf16) beside
the target's GGUF (the bundled file requantized to BF16, or with --weights int4 the bundled 4-bit
file itself), greedy, the first turns of the first N MT-bench questions, 128 new tokens, 2 threads,
one prompt at a time. Each setting is a server started afresh: `--spec-draft-n-max` (tokens drafted
per round at most) and `--spec-draft-p-min` (drafting stops at a token the head gives less than
this; llama.cpp's default 0.75), beside plain llama.cpp in the same run. Records tokens/s, tau and
whether the tokens are plain llama.cpp's (bf16 rounding may part them, as in the conformance runs).

    .venv/bin/python benchmarks/experiments/llamacpp_draft_settings.py smollm2-135m-instruct --head eagle3 \
        --out benchmarks/results/llamacpp-draft-settings/smollm2-135m-instruct-bf16.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import machine, write_json
from eaglespec.bench.datasets import load_items
from eaglespec.bench.run import eagle3_gguf
from eaglespec.decoding.generate import chat_ids
from eaglespec.files import save_figure
from eaglespec.models.llamacpp import LlamaServer, peer_gguf, tau
from eaglespec.models.load import load_target


def run(server: LlamaServer, prompts: list[list[int]], max_new_tokens: int) -> dict:
    server.complete(prompts[0], 8, 0.0, 0)  # warm-up
    tokens, seconds, accepted = [], 0.0, 0
    for ids in prompts:
        out = server.complete(ids, max_new_tokens, 0.0, 0)
        tokens.append(out["token_ids"])
        seconds += out["seconds"]
        accepted += out["timings"].get("draft_n_accepted", 0)
    made = sum(map(len, tokens))
    return {"tokens": tokens, "tokens_per_s": made / seconds, "tau": tau(made, {"draft_n_accepted": accepted})}


def plot(result: dict, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for p_min in sorted({r["p_min"] for r in result["runs"]}):
        runs = [r for r in result["runs"] if r["p_min"] == p_min]
        ax.plot([r["n_max"] for r in runs], [r["tokens_per_s"] for r in runs], marker="o", label=f"p-min {p_min}")
    ax.axhline(result["plain"]["tokens_per_s"], color="black", linestyle="--", label="plain llama.cpp")
    ns = sorted({r["n_max"] for r in result["runs"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("--spec-draft-n-max")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"llama.cpp EAGLE-3 with our head: {result['model']} ({result['target_gguf']})", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--head", default="eagle3", help="an EAGLE-3 head: a folder, 'default' or 'eagle3'")
    parser.add_argument("--weights", choices=("dense", "int4"), default="dense")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--n-max", default="1,2,3,4,6,8,16")
    parser.add_argument("--p-min", default="0,0.5,0.75,0.9")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_target(args.model, "bfloat16")
    prompts = [chat_ids(target, [{"role": "user", "content": item.turns[0]}], paragraphs=True)  # as the bench renders
               for item in load_items("mt-bench", args.prompts)]
    head = eagle3_gguf(args.head, target)
    del target
    gguf = peer_gguf(args.model, args.weights, "bfloat16")

    def serve(*extra: str, draft: Path | None = None) -> dict:
        server = LlamaServer("llama.cpp-eagle3" if draft else "llama.cpp", gguf, 2, draft, extra=extra)
        try:
            return run(server, prompts, args.max_new_tokens)
        finally:
            server.stop()

    plain = serve()
    runs = []
    for p_min in (float(x) for x in args.p_min.split(",")):
        for n_max in (int(x) for x in args.n_max.split(",")):
            got = serve("--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", str(p_min),
                        draft=head)
            runs.append({"n_max": n_max, "p_min": p_min, "tokens_per_s": got["tokens_per_s"], "tau": got["tau"],
                         "speedup": got["tokens_per_s"] / plain["tokens_per_s"],
                         "same_tokens_as_plain": [a == b for a, b in zip(got["tokens"], plain["tokens"])]})
            print(f"n-max {n_max:2d} p-min {p_min:.2f}: {got['tokens_per_s']:6.1f} tok/s, tau {got['tau']:.2f}, "
                  f"{runs[-1]['speedup']:.2f}x plain", flush=True)
    best = max(runs, key=lambda r: r["tokens_per_s"])
    result = {"model": args.model, "head": args.head, "target_gguf": gguf.name, "prompts": prompts,
              "max_new_tokens": args.max_new_tokens, "plain": {"tokens_per_s": plain["tokens_per_s"]},
              "runs": runs, "best": {k: best[k] for k in ("n_max", "p_min", "tokens_per_s", "tau", "speedup")},
              "machine": machine()}
    out = Path(args.out)
    write_json(result, out)
    plot(result, out.with_suffix(".png"))
    print(f"plain {plain['tokens_per_s']:.1f} tok/s; best: n-max {best['n_max']}, p-min {best['p_min']}: "
          f"{best['tokens_per_s']:.1f} tok/s ({best['speedup']:.2f}x), tau {best['tau']:.2f}; wrote {out}")


if __name__ == "__main__":
    main()
