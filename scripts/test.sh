#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian/Ubuntu machine, then run it.
# System packages: Java (ScienceWorld's simulator), cmake and g++ (ALFWorld's planner builds from source).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  else
    echo "scripts/test.sh: please install: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q -c constraints.txt -e '.[textworld,alfworld,scienceworld,search,pyserini,dev]'
python3 -m pytest -q "$@"
