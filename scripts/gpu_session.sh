#!/bin/bash
# The GPU session's one command (docs/scaling.md, "On a GPU"), run from the checkout's root on the
# GPU machine with .whl/ carried (made here by ../shared/tools/gpu-wheels.sh):
#
#   IBPO_COMMIT=<this checkout's commit> bash scripts/gpu_session.sh [more scripts/gpu_check.py arguments]
#
# 1. installs the wheels the GPU image lacks into /tmp/site (FACTS.md's command);
# 2. compiles the project's and the wheels' sources on every core (the first process paid 6.5 s
#    compiling them one by one on the first lease);
# 3. runs scripts/gpu_check.py with a budget of IBPO_BUDGET_S seconds (default 480) under
#    `python -X importtime`, writing as it goes to $OUT when set (the device tool's folder that
#    comes back), else results/gpu_check/: <device>_<date>.json after every case, the check's
#    stdout, and its stderr (the import-time tree of the GPU machine, then any warnings).
# Exit status: the check's.
set -uo pipefail
cd "$(dirname "$0")/.."
dir="${OUT:-results/gpu_check}"
mkdir -p "$dir"
t0=$(date +%s.%N)
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }

wheels="${IBPO_WHEELS:-.whl}"  # (a test names an empty folder: a checkout here may hold the GPU machine's wheels)
if compgen -G "$wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl \
    || { echo "gpu_session.sh: the wheels did not install"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  echo "wheels installed in $(since "$t0") s"
else
  echo "gpu_session.sh: no .whl/ here (carry it: run ../shared/tools/gpu-wheels.sh first); going on without"
fi
t1=$(date +%s.%N)
python3 -m compileall -q -j 0 ibpo_lit callbacks scripts tests ${PYTHONPATH:+/tmp/site} >/dev/null 2>&1
echo "sources compiled in $(since "$t1") s"

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export IBPO_T0=$(date +%s.%N)  # the check counts its budget and its seconds to the first step from here
python3 -X importtime scripts/gpu_check.py --budget-s "${IBPO_BUDGET_S:-480}" --out-dir "$dir" "$@" \
  2>"$dir/gpu_check_stderr.txt" | tee "$dir/gpu_check_stdout.txt"
status=${PIPESTATUS[0]}
echo "--- stderr without the import times ($dir/gpu_check_stderr.txt):"
grep -v '^import time:' "$dir/gpu_check_stderr.txt" | tail -n 40
echo "gpu_session.sh: exit $status after $(since "$t0") s"
exit "$status"
