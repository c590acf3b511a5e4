"""Power of the sampling test in tests/test_eagle.py: its 15 bins and exact vanilla probabilities
(SmolLM2, temperature 1, "The best way to learn programming is"), then 2,000 multinomial draws of
300 samples from the exact distribution and from shifted ones, and how often the chi-square test
rejects at p < 1e-3.

    .venv/bin/python benchmarks/chi_square_power.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import test_eagle  # the test's own binning and chi-square

from eaglespec.models.load import resolve

N, TRIALS = 300, 2000


def main() -> None:
    folder = resolve("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    bins = test_eagle.exact_bins(model, tokenizer("The best way to learn programming is")["input_ids"], N)
    probs = torch.tensor([*bins.values(), 1 - sum(bins.values())], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)

    def rejection_rate(alternative: torch.Tensor) -> float:
        rejected = 0
        for _ in range(TRIALS):
            draws = torch.multinomial(alternative, N, replacement=True, generator=generator)
            counts = draws.bincount(minlength=len(alternative)).tolist()
            rejected += test_eagle.chi_square_p_value(counts, probs.tolist()) <= 1e-3
        return rejected / TRIALS

    print(f"{len(bins)} bins; exact samples rejected: {rejection_rate(probs):.4f}")
    top = int(probs[:-1].argmax())
    for shift in (0.05, 0.10):
        alternative = probs.clone()
        alternative[top] -= shift
        alternative[-1] += shift
        print(f"total variation {shift:.2f} moved from the likeliest bin to the rest: caught {rejection_rate(alternative):.3f}")


if __name__ == "__main__":
    main()
