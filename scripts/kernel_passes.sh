#!/usr/bin/env bash
# The exactness layer (pytest marker `exactness`: the files that compare an update or a logged loss with stock TRL's
# against an FP32 floor) under CPU kernel sets other than this machine's own: ATen's vector kernels
# (ATEN_CPU_CAPABILITY), MKL's code path (MKL_ENABLE_INSTRUCTIONS) and oneDNN's (ONEDNN_MAX_CPU_ISA). Rounding, and so
# every floor, depends on them; a tolerance that holds only on the kernels it was tuned on fails here (issue 39).
#
#   bash scripts/kernel_passes.sh                 # one kernel set other than this machine's (what .ci/run runs)
#   bash scripts/kernel_passes.sh avx2 default    # the sets named (before a tolerance change lands: both)
#
# avx2: what an AVX2-only machine (no AVX-512) runs; the set CI picks on an AVX-512 machine.
# default: ATen's non-vectorized kernels, MKL and oneDNN at their AVX2 paths; the set CI picks on any other machine.
# Called by .ci/run after the whole suite, which ran on this machine's own kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
native=$(.venv/bin/python -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
sets=("$@")
if [ ${#sets[@]} -eq 0 ]; then
  case "$native" in AVX512*) sets=(avx2) ;; *) sets=(default) ;; esac
fi
for set in "${sets[@]}"; do
  case "$set" in
    avx2|default) ;;
    *) echo "kernel_passes: unknown kernel set '$set' (avx2 | default)" >&2; exit 2 ;;
  esac
  got=$(ATEN_CPU_CAPABILITY=$set .venv/bin/python -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
  if [ "$got" != "${set^^}" ]; then  # torch ignored the setting: the pass would test nothing new
    echo "kernel_passes: ATEN_CPU_CAPABILITY=$set gave capability $got" >&2; exit 1
  fi
  echo "kernel_passes: the exactness layer under ATEN_CPU_CAPABILITY=$set (this machine: $native)"
  ATEN_CPU_CAPABILITY=$set MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
    .venv/bin/python -m pytest -q -p no:cacheprovider -m exactness
done
