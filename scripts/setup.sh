#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv, eaglespec installed in it (with every extra, at the
# exact versions of constraints.txt), the default model fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(command -v python3.11 || command -v python3)
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
    .venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
    touch "$stamp"
fi
.venv/bin/eaglespec fetch smollm2-135m-instruct
