#!/usr/bin/env bash
# Set up, then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# llama.cpp's converter, which the GGUF tests run (the source only: seconds, no build)
bash scripts/setup_llamacpp.sh --source >/dev/null
# the server's page is tested in headless Chromium: Debian's, where this machine can install it
if ! { command -v chromium && command -v chromedriver; } >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing chromium and chromium-driver for the page's browser test"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get install -y -q chromium chromium-driver || { apt-get update -q && apt-get install -y -q chromium chromium-driver; }; } \
            >/dev/null 2>&1 || echo "could not install chromium: the browser test will be skipped"
    else
        echo "no chromium / chromedriver: the browser test will be skipped (install both to run it)"
    fi
fi
# the layers of the package (pyproject.toml's import-linter contracts)
.venv/bin/lint-imports --no-cache
# the docs site: --strict fails on a broken link between pages, to a repository file or in the README
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
# the fast tier first (no bundled model loaded), then the rest; -rs: the reason of each skip. Tests
# that run llama.cpp's programs (-m llamacpp) are scripts/test-interop.sh's, which builds them. A tier
# that the arguments leave empty (pytest's exit code 5) is not a failure.
tier() { .venv/bin/python -m pytest -q -rs -m "$@" || [ $? -eq 5 ]; }
tier "not slow and not browser and not gpu and not llamacpp" "$@"
tier "slow or browser or gpu" "$@"
