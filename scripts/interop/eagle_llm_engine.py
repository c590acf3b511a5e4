"""The official runtime's side of benchmarks/experiments/interop.py, run in its own environment (SafeAILab's
`eagle-llm` 1.2.1 with the transformers 4.36.2 it was written for, without eaglespec): its EaModel
on the given prompt token ids, one at a time, greedy, with the head exported by `eaglespec export
--format official`, drafting and verifying a chain of k tokens ([[0], [0, 0], ...]), or its plain
decoding (naive_generate). Prints one RESULT line: the tokens (cut at max_new_tokens and after the
end-of-sequence token), the seconds of the timed generation, the tokens it made (the runtime stops
a round past max_new_tokens), the target forwards it ran for them (the prefill included) and tau.

Three things the runtime predates are bridged here, none of them in the head: transformers 5 writes
rope_parameters where 4.36 reads rope_theta; the runtime builds RoPE with LLaMA-2's base, 10000,
whatever the config says (given the target's here); and it reads only the end-of-sequence id from
its tokenizer, whose transformers-5 tokenizer.json the tokenizers release 4.36 pins cannot parse.

    python eagle_llm_engine.py '{"target": DIR, "head": DIR, "prompts": [[ids]], "max_new_tokens": 128, "k": 3}'
"""

import json
import sys
import tempfile
import time
import types
from pathlib import Path


def old_style_target(target: Path, out: Path) -> dict:
    """The target folder at `out` as transformers 4.36 reads it (the files linked, config.json with
    rope_theta at the top); returns that config."""
    out.mkdir()
    for f in target.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    config = json.loads((target / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    config["rope_theta"] = config.get("rope_theta", rope.get("rope_theta", 10000.0))
    config["rope_scaling"] = None
    (out / "config.json").write_text(json.dumps(config))
    return config


def load(args: dict):
    import torch
    import eagle.model.cnets as cnets
    import eagle.model.ea_model as ea
    import eagle.model.modeling_llama_kv as kv

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"
        config = old_style_target(Path(args["target"]), target)
        ea.AutoTokenizer = types.SimpleNamespace(
            from_pretrained=lambda _: types.SimpleNamespace(eos_token_id=config["eos_token_id"]))
        for module in (kv, cnets):
            for cls in vars(module).values():
                if isinstance(cls, type) and cls.__name__.endswith("RotaryEmbedding"):
                    cls.__init__.__defaults__ = tuple(config["rope_theta"] if d == 10000 else d
                                                      for d in cls.__init__.__defaults__)
        dtype = getattr(torch, args.get("dtype", "bfloat16"))
        return cnets, ea, ea.EaModel.from_pretrained(base_model_path=str(target), ea_model_path=args["head"],
                                              torch_dtype=dtype).eval()


def main() -> None:
    import torch

    args = json.loads(sys.argv[1])
    torch.set_num_threads(2)
    cnets, ea, model = load(args)
    chain = [[0] * (i + 1) for i in range(args["k"])]
    model.ea_layer.tree = chain  # the head drafts the runtime's 63-node tree unless told otherwise
    model.ea_layer.tree_buffer = cnets.generate_tree_buffers(chain, model.ea_layer.embed_tokens.weight.device)
    rounds, generated = [0], [0]  # target forwards; tokens made, past max_new_tokens too
    tree_decoding = ea.tree_decoding

    def counted(*a, **kw):  # one target forward per verification round
        rounds[0] += 1
        return tree_decoding(*a, **kw)

    ea.tree_decoding = counted
    n, eos = args["max_new_tokens"], model.tokenizer.eos_token_id

    def generate(ids: list[int]) -> list[int]:
        input_ids = torch.tensor([ids])
        if args.get("vanilla"):
            out = input_ids
            for out in model.naive_generate(input_ids, max_steps=n, tree_choices=chain):
                rounds[0] += 1
                if out.shape[1] - len(ids) >= n:
                    break
        else:
            out = model.eagenerate(input_ids, max_new_tokens=n, tree_choices=chain)
        rounds[0] += 1  # the prefill
        new = out[0, len(ids):].tolist()
        generated[0] += len(new)
        return new[:min(n, new.index(eos) + 1 if eos in new else n)]

    generate(args["prompts"][0][:32])  # warm-up
    rounds[0] = generated[0] = 0
    start = time.perf_counter()
    tokens = [generate(p) for p in args["prompts"]]
    seconds = time.perf_counter() - start
    result = {"tokens": tokens, "seconds": seconds, "forwards": rounds[0], "generated": generated[0]}
    if not args.get("vanilla"):
        result["tau"] = generated[0] / rounds[0]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
