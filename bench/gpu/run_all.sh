#!/usr/bin/env bash
# One prepared script for a single-H200 (or any one-GPU CUDA) machine: runs every GPU check in bench/gpu/
# within a total budget (default 450 s, under 8 minutes) and writes the results as files.
#
#   bench/gpu/run_all.sh [OUT_DIR]        OUT_DIR defaults to $OUT, else bench/gpu/results
#   BUDGET_S=300 bench/gpu/run_all.sh     a smaller total budget
#
# A check is any bench/gpu/<name>.py (not starting with '_'); it runs as `python -m bench.gpu.<name>` with
# BENCH_OUT=<OUT_DIR> in its environment (write result files there), a per-check time limit equal to the
# budget left, and its output saved as <OUT_DIR>/<name>.log. <OUT_DIR>/summary.md lists the machine, each
# check's exit code, wall time and RESULT line. Exit code: 0 if every check passed, 1 otherwise, 2 if no GPU.
set -uo pipefail

OUT_DIR="${1:-${OUT:-}}"
[[ -n "$OUT_DIR" ]] && OUT_DIR="$(realpath -m "$OUT_DIR")"  # relative to where it was called from
cd "$(dirname "$0")/../.."
OUT_DIR="${OUT_DIR:-bench/gpu/results}"
BUDGET_S="${BUDGET_S:-450}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONUNBUFFERED=1 BENCH_OUT="$OUT_DIR"
summary="$OUT_DIR/summary.md"
start=$(date +%s)

{
  echo "# GPU checks ($(date -u +'%Y-%m-%d %H:%M UTC'))"
  echo
  echo "Command: \`bench/gpu/run_all.sh\` (budget ${BUDGET_S} s)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
  "$PY" - <<'PYEOF' 2>&1
import os, platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"cpus {os.cpu_count()}, gpu {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
PYEOF
  echo '```'
  echo
  echo "| check | exit | wall | result |"
  echo "|---|---|---|---|"
} >"$summary"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "| (none) | 2 | 0 s | no CUDA device visible to torch; run this on the GPU machine |" >>"$summary"
  cat "$summary"
  echo "error: no CUDA device visible to torch; run bench/gpu/run_all.sh on a GPU machine" >&2
  exit 2
fi

status=0
shopt -s nullglob
for script in bench/gpu/*.py; do
  name="$(basename "$script" .py)"
  [[ "$name" == _* || "$name" == "__init__" ]] && continue
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  if (( left < 20 )); then
    echo "| $name | skipped | 0 s | budget spent |" >>"$summary"
    status=1
    continue
  fi
  echo "== $name (limit ${left} s)"
  t0=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$left" "$PY" -m "bench.gpu.$name" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  wall=$(( $(date +%s) - t0 ))
  result="$(grep -E '^RESULT ' "$OUT_DIR/$name.log" | tail -n 1 | sed 's/^RESULT //; s/|/\\|/g')"
  [[ $rc -eq 124 ]] && result="timed out after ${left} s; ${result}"
  echo "| $name | $rc | ${wall} s | ${result:--} |" >>"$summary"
  [[ $rc -ne 0 ]] && status=1
done

cat "$summary"
exit $status
