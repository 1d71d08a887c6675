#!/usr/bin/env bash
# Dependency drift, found on purpose: a separate venv (.venv-latest) with the latest versions that pyproject.toml's
# ranges allow (not constraints/dev.txt's pins), then the fast layer and the exactness layer against it.
#
#   bash scripts/check_latest_deps.sh            # install (or upgrade) .venv-latest and run both layers
#   CI_LATEST_PYTEST_ARGS="-x" bash scripts/...  # extra pytest arguments
#
# It writes .venv-latest/constraints-latest.txt (that venv's pip freeze): where both layers pass, copying it over
# constraints/dev.txt moves the project's pins (then run the whole suite: bash .ci/run). The exit status is pytest's.
# The development venv (.venv) and CI are untouched. .ci/run runs this too when THUNDERSYNC_CI_LATEST=1.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-latest
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# torch stays at the one CPU build this machine has (an open range would pull a multi-GB CUDA build); everything
# else is the newest release the package's ranges admit.
DS_BUILD_OPS=0 "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade --upgrade-strategy eager \
  torch==2.13.0 -e ".[test,deepspeed]"
"$VENV/bin/pip" freeze --disable-pip-version-check 2>/dev/null | grep -v -E "^(-e |# Editable)" \
  | sed 's/^torch==2.13.0+cpu$/torch==2.13.0/' >"$VENV/constraints-latest.txt"
echo "check_latest_deps: what moved against constraints/dev.txt:"
moved=$(diff <(grep -v '^#' constraints/dev.txt | sort -f) <(sort -f "$VENV/constraints-latest.txt") || true)
echo "${moved:-  nothing}" | grep -v '^---$' | grep -v '^[0-9]'  # '<' pinned, '>' latest
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "fast or exactness" ${CI_LATEST_PYTEST_ARGS:-}
