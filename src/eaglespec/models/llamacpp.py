"""llama.cpp's toolchain: its programs, GGUF copies of our weights, its converter and its server,
used by `eaglespec bench` (llama.cpp as a peer: what a CPU user runs instead of us, on the same
weights and the same token ids) and by `eaglespec export --format llama.cpp`.

Methods: `llama.cpp` (plain decoding), `llama.cpp-ngram` (its n-gram speculation, `ngram-simple`),
`llama.cpp-draft` (classic speculative decoding with the bench's draft model) and `llama.cpp-eagle3`
(its EAGLE-3 drafting with the bench's head, an EAGLE-3 head exported in vLLM's layout and
converted by llama.cpp's own `convert_hf_to_gguf.py`; llama.cpp drafts with nothing else). Each runs in
llama.cpp's own `llama-server`, started once per method and asked for one completion per turn
(token ids in, token ids out, no prompt cache), so it is timed the way our methods are: the whole
request, prefill included. The server runs llama.cpp's native speculative code; the Python
bindings would have put their own Python-level lookup in its place.

Weights: `--weights int4` runs the bundled GGUF itself (Q4_1 for SmolLM2: the very codes our int4
keeps; Q4_K_M for Qwen); `dense` runs that GGUF requantized by `llama-quantize` to BF16 (or F32 for
`--dtype float32`), the same numbers our dense weights hold; `int8` runs Q8_0 (group-32 int8 beside
our per-channel int8). The programs come from `bash scripts/setup_llamacpp.sh`.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from eaglespec.errors import InvalidArgumentError, MissingDependencyError
from eaglespec.models.fetch import fetch_gguf
from eaglespec.models.registry import BUNDLED, cache_root

PEERS = {
    "llama.cpp": [],
    "llama.cpp-ngram": ["--spec-type", "ngram-simple"],
    "llama.cpp-draft": ["--spec-type", "draft-simple"],  # plus -md DRAFT.gguf
    "llama.cpp-eagle3": ["--spec-type", "draft-eagle3"],  # plus -md HEAD.gguf
}
DRAFTERS = {"llama.cpp-draft": "a draft model: pass --draft-model", "llama.cpp-eagle3": "an EAGLE-3 head: pass --head"}
GGUF_TYPES = {("dense", "bfloat16"): "BF16", ("dense", "float32"): "F32", ("int8", "bfloat16"): "Q8_0",
              ("int8", "float32"): "Q8_0"}
SETUP = "bash scripts/setup_llamacpp.sh"
SOURCE_VERSION = "0.3.36"  # the llama-cpp-python sdist whose llama.cpp source setup_llamacpp.sh builds
STARTUP_SECONDS = 300


def programs() -> Path:
    """The folder of the built llama.cpp programs, or a one-line error saying how to build them."""
    folder = cache_root() / "llama.cpp" / "bin"
    if not (folder / "VERSION").is_file():
        raise MissingDependencyError(f"the llama.cpp peer is not built: run `{SETUP}` (about 15 minutes "
                                     "on 2 cores), then run the bench again")
    return folder


def source_gguf(spec: str) -> Path:
    """The GGUF file a model spec stands for: a bundled model's own file, or a .gguf path."""
    if spec in BUNDLED:
        return fetch_gguf(BUNDLED[spec])
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise InvalidArgumentError(f"model '{spec}': the llama.cpp peer needs a GGUF file: use a bundled model "
                               f"({', '.join(BUNDLED)}) or a .gguf path")


def peer_gguf(spec: str, weights: str, dtype: str) -> Path:
    """The GGUF holding the weights our run uses: the file itself for int4, else requantized."""
    source = source_gguf(spec)
    if weights == "int4":
        return source
    kind = GGUF_TYPES[(weights, dtype)]
    out = cache_root() / "llama.cpp" / "gguf" / f"{source.stem}-{source.stat().st_size}-{kind}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        command = [str(programs() / "llama-quantize"), "--allow-requantize", str(source), str(partial), kind]
        try:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        except subprocess.CalledProcessError as err:
            raise InvalidArgumentError(f"llama-quantize could not make a {kind} copy of {source}: "
                                       f"{err.stderr.strip().splitlines()[-1:]}") from None
        os.replace(partial, out)
    return out


# Target families whose llama.cpp graph hands a draft the hidden states entering its layers
# (`t_layer_inp` in src/models/<arch>.cpp), which `--spec-type draft-eagle3` reads: Llama's graph
# (Mistral and Mixtral convert to it), Qwen3's and Qwen3-MoE's; not Qwen2's, Gemma-3's or Phi-3's.
EAGLE3_TARGETS = ("llama", "mistral", "mixtral", "qwen3", "qwen3_moe")


def check_eagle3_head(head) -> None:
    """llama.cpp's draft-eagle3 runs EAGLE-3 heads whose layer is Llama's (no attention biases) on
    targets whose graph gives it their layers' inputs (EAGLE3_TARGETS)."""
    if head.head_type != "eagle3":
        raise InvalidArgumentError(f"llama.cpp drafts with EAGLE-3 heads only and this head is {head.head_type}: "
                                   "pass --head with an EAGLE-3 head (eaglespec train --head-type eagle3)")
    if head.config.family not in EAGLE3_TARGETS:
        raise InvalidArgumentError(f"llama.cpp's {head.config.family} graph does not hand a draft its layers' "
                                   f"inputs, so it drafts with EAGLE-3 heads only for {', '.join(EAGLE3_TARGETS)} "
                                   "targets: export this head with --format vllm or sglang")
    if head.config.qkv_bias:
        raise InvalidArgumentError("llama.cpp's EAGLE-3 layer has no attention biases and this head's layer "
                                   "(the target family's) has them: export it with --format vllm or sglang")


def source() -> Path:
    """The llama.cpp source (its converter and gguf-py), or a one-line error saying how to fetch it."""
    folder = cache_root() / "llama.cpp" / f"src-{SOURCE_VERSION}"
    if not (folder / "convert_hf_to_gguf.py").is_file() or importlib.util.find_spec("sentencepiece") is None:
        raise MissingDependencyError(f"llama.cpp's converter is not here: run `{SETUP} --source` (seconds; "
                                     f"`{SETUP}` also builds the programs)")
    return folder


def convert_hf(folder: Path, out: Path, *options: str, outtype: str = "f32") -> None:
    """llama.cpp's own converter (convert_hf_to_gguf.py) on a Hugging Face folder, to a GGUF at `out`:
    f32 (every value exactly; bf16 ones too) or bf16 (bf16 values exactly)."""
    src = source()
    command = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(folder), "--outfile", str(out),
               "--outtype", outtype, *options]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(src / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise InvalidArgumentError(f"llama.cpp's converter refused {folder}: "
                                   f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")


def convert_eagle3(layout: Path, target_folder: Path, out: Path, dtype: str = "bfloat16") -> None:
    """An EAGLE-3 head in vLLM's layout, with the target's config and tokenizer
    (`--target-model-dir`), to the GGUF that draft-eagle3 loads: bf16 (our heads' weights exactly,
    and what llama.cpp drafts fastest with) or, with dtype float32, f32 (llama.cpp then drafts in
    f32, as our fp32 engine does, instead of rounding the draft's activations to bf16)."""
    convert_hf(layout, out, "--target-model-dir", str(target_folder), outtype="f32" if dtype == "float32" else "bf16")


class LlamaServer:
    """One `llama-server` process on a loopback port, serving one method's completions."""

    def __init__(self, method: str, gguf: Path, threads: int, draft_gguf: Path | None = None,
                 context: int = 4096, extra: tuple[str, ...] = ()):
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [str(programs() / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                   "-t", str(threads), "-tb", str(threads), "-c", str(context), "-np", "1", "--no-webui",
                   *PEERS[method]]
        if method in DRAFTERS:
            if draft_gguf is None:
                raise InvalidArgumentError(f"{method} needs {DRAFTERS[method]}")
            command += ["-md", str(draft_gguf)]  # its threads default to the target's
        command += extra
        self.log = cache_root() / "llama.cpp" / f"server-{method}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        self._wait_ready(method)

    def _wait_ready(self, method: str) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise MissingDependencyError(f"llama-server for {method} exited with code {self.process.returncode}: "
                                             f"see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise MissingDependencyError(f"llama-server for {method} did not start in {STARTUP_SECONDS} s: see {self.log}")

    def complete(self, ids: list[int], max_new_tokens: int, temperature: float, seed: int,
                 ignore_eos: bool = False) -> dict:
        """One completion: its token ids, wall seconds (prefill included) and llama.cpp's timings."""
        body = {"ignore_eos": ignore_eos, "prompt": ids, "n_predict": max_new_tokens, "cache_prompt": False, "return_tokens": True,
                "temperature": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
                "repeat_penalty": 1.0, "seed": seed, "stream": False}
        request = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=3600) as response:
            answer = json.loads(response.read())
        seconds = time.perf_counter() - started
        return {"token_ids": answer["tokens"], "seconds": seconds, "timings": answer.get("timings", {})}

    def reset_peak(self) -> None:
        try:
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        except OSError:
            pass

    def peak_mb(self) -> float:
        """The server's own peak resident set (0 where /proc is missing)."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return 0.0
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def tau(new_tokens: int, timings: dict) -> float:
    """Tokens per target forward: every forward yields one token plus the draft tokens it accepted."""
    accepted = timings.get("draft_n_accepted", 0)
    return new_tokens / max(new_tokens - accepted, 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
