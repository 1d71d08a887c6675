#!/usr/bin/env bash
# One-time setup on a fresh Debian/Ubuntu machine: the bubblewrap sandbox, a virtualenv, the package with its test
# and deepspeed extras. torch is pinned first so a CPU machine never resolves a multi-GB CUDA build; DeepSpeed builds
# no ops at install (DS_BUILD_OPS=0: the few it needs are JIT-compiled on first use). Every dependency is installed at
# the exact version in constraints/dev.txt, so every machine tests the same code (the package's own ranges in
# pyproject.toml stay open for users; scripts/check_latest_deps.sh tries the latest allowed). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else SUDO="none"; fi
  if [ "$SUDO" = none ]; then
    echo "setup: bubblewrap is missing and this user cannot install Debian packages; sandboxed tools will fail" >&2
  else
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq bubblewrap >/dev/null
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
DS_BUILD_OPS=0 .venv/bin/pip install -q --disable-pip-version-check -c constraints/dev.txt torch==2.13.0 \
  -e ".[test,deepspeed]"
echo "setup: ready (.venv, bubblewrap $(bwrap --version 2>/dev/null | cut -d' ' -f2))"
# Real vLLM in its own venv (.venv-vllm) where this machine can run it; says why not otherwise, never fails here.
bash scripts/setup_vllm.sh
