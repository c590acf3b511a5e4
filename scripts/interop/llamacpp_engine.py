"""llama.cpp's side of benchmarks/experiments/interop.py, run in our own environment: it drives llama.cpp's
programs (bash scripts/setup_llamacpp.sh builds them from the source in the llama-cpp-python sdist).
llama-server on the target's GGUF in the run's dtype (F32 or BF16, requantized from the bundled
file), plain or with the EAGLE-3 head exported by `eaglespec export --format llama.cpp` (a GGUF made by
llama.cpp's own convert_hf_to_gguf.py) as `--spec-type draft-eagle3`, drafting a chain of k tokens
every round (n-max k, p-min 0: no early stop on low confidence), greedy, one prompt at a time, no
prompt cache. Prints one RESULT line: the tokens, the seconds of the timed requests (prefill
included), tau and llama.cpp's draft counters.

    .venv/bin/python llamacpp_engine.py '{"model": NAME, "head": DIR, "prompts": [[ids]],
                                          "max_new_tokens": 128, "k": 3, "dtype": "float32"}'
"""

import json
import sys
from pathlib import Path

from eaglespec.models.llamacpp import LlamaServer, peer_gguf, tau
from eaglespec.heads.export import LLAMA_CPP_FILE


def main() -> None:
    args = json.loads(sys.argv[1])
    target = peer_gguf(args["model"], "dense", args["dtype"])
    if args.get("vanilla"):
        server = LlamaServer("llama.cpp", target, 2)
    else:
        chain = ("--spec-draft-n-max", str(args["k"]), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0")
        server = LlamaServer("llama.cpp-eagle3", target, 2, Path(args["head"]) / LLAMA_CPP_FILE, extra=chain)
    try:
        server.complete(args["prompts"][0], 8, 0.0, 0)  # warm-up
        tokens, seconds, drafted, accepted = [], 0.0, 0, 0
        for ids in args["prompts"]:
            out = server.complete(ids, args["max_new_tokens"], 0.0, 0)
            tokens.append(out["token_ids"])
            seconds += out["seconds"]
            drafted += out["timings"].get("draft_n", 0)
            accepted += out["timings"].get("draft_n_accepted", 0)
    finally:
        server.stop()
    made = sum(map(len, tokens))
    print("RESULT " + json.dumps({"tokens": tokens, "seconds": seconds, "tau": tau(made, {"draft_n_accepted": accepted}),
                                  "draft_n": drafted, "draft_n_accepted": accepted}))


if __name__ == "__main__":
    main()
