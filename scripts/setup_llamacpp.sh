#!/usr/bin/env bash
# Optional set-up for the llama.cpp peer of `eaglespec bench` (methods llama.cpp, llama.cpp-ngram,
# llama.cpp-draft, llama.cpp-eagle3) and `eaglespec export --format llama.cpp`: builds llama-server,
# llama-bench and llama-quantize from the llama.cpp source vendored in the llama-cpp-python sdist
# (the package registry is the only source this machine reaches), CPU only, tuned to this CPU.
# About 10-15 minutes on 2 cores; idempotent; prints the folder of the programs. With --source it
# only fetches the source (llama.cpp's converter, which the GGUF tests run; seconds) and prints its folder.
#
#     bash scripts/setup_llamacpp.sh          # then: eaglespec bench ... --methods vanilla,llama.cpp
#     bash scripts/setup_llamacpp.sh --source
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.3.36  # also models/llamacpp.py's SOURCE_VERSION
cache="${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}/llama.cpp"
bin="$cache/bin"
# llama.cpp's converter (eaglespec export --format llama.cpp) imports sentencepiece, even for the
# byte-level BPE tokenizers of our models
.venv/bin/pip install --quiet --disable-pip-version-check sentencepiece==0.2.1
fetch_source() {
    [ -d "$cache/src-$version" ] && return
    mkdir -p "$cache"
    [ -f "$cache/sdist/llama_cpp_python-$version.tar.gz" ] || .venv/bin/pip download --quiet \
        --disable-pip-version-check --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$cache/sdist"
    rm -rf "$cache/unpack"
    mkdir -p "$cache/unpack"
    tar xzf "$cache/sdist/llama_cpp_python-$version.tar.gz" -C "$cache/unpack"
    mv "$cache/unpack/llama_cpp_python-$version/vendor/llama.cpp" "$cache/src-$version"
    rm -rf "$cache/unpack"
}
if [ "${1:-}" = "--source" ]; then
    fetch_source
    echo "$cache/src-$version"
    exit 0
fi
# ggml's AMX matrix code in this version crashes (SIGSEGV in ggml_backend_amx_mul_mat) on the first
# batch of more than one token of a Q8_0 or Q4_1 model (measured on a 2-core Intel Xeon with AMX,
# 2026-12-02): on CPUs with AMX, build for the CPU's vector instruction sets without it.
build="build-$version"
cpu=(-DGGML_NATIVE=ON)
if grep -qw amx_int8 /proc/cpuinfo; then
    build="build-$version-noamx"
    cpu=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
         -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
fi
if [ -x "$bin/llama-quantize" ] && [ "$(cat "$bin/VERSION" 2>/dev/null)" = "$build" ]; then
    echo "$bin"
    exit 0
fi
fetch_source
cmake -S "$cache/src-$version" -B "$cache/$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "${cpu[@]}" -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$cache/$build" --target llama-server llama-bench llama-quantize -j "$(nproc)"
# publish the programs only once both are built (a half-done build never looks ready)
rm -rf "$bin.tmp"
mkdir -p "$bin.tmp"
for program in llama-server llama-bench llama-quantize; do cp "$cache/$build/bin/$program" "$bin.tmp/"; done
echo "$build" > "$bin.tmp/VERSION"
rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "$bin"
