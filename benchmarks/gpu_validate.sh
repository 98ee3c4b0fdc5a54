#!/usr/bin/env bash
# Calibrate, then validate the simulator against the real engine, on the device machine's GPU, into $OUT.
#
# Run from the repository root: OUT=some/folder bash benchmarks/gpu_validate.sh [--smoke]
#
# GPU mode (default): calibrates MODEL (llama3-8b: bfloat16, Triton kernels, --quick grid) into
# $OUT/<model>-<gpu>.json, then runs `pagesim validate` against the GPU engine on one workload
# (VAL_REQUESTS kwon2023-alpaca requests at VAL_RATE requests/s, one noise run) into
# $OUT/validation/ (validation.json, steps.csv, validation.pdf). Also $OUT/env.txt (date, commit,
# GPU, versions), $OUT/log.txt (both commands' output) and $OUT/timings.txt (each phase's wall
# time and exit status): at most 8 files, the most the device machine sends back.
# If the calibration fails or overruns CAL_TIMEOUT, FALLBACK_MODEL (llama-350m; if that name does
# not resolve here, llama-125m, then small, said so in the log) is calibrated instead and
# validated; MODEL=llama-350m asks for it from the start.
#
# Time budget (BUDGET_S, 480 s: the 8 minutes the issue allows; a device command may run 10):
#   env.txt                   ~10 s  (imports torch, first CUDA call)
#   calibration, llama3-8b    ~60-150 s expected, killed at CAL_TIMEOUT 240 s: the quick grid is
#                             224 points x (2 warm-up + 7 timed) one-layer forward passes of a few ms
#                             each (launches, synchronisations, at most ~5 ms of device work), each
#                             point's batch built in Python, every Triton kernel's first compile
#                             (nothing is cached on a fresh machine) and the largest decode cache
#                             (256 seqs x 8192 tokens: 8.6 GB for one layer)
#   fallback calibration      killed at FALLBACK_CAL_TIMEOUT 100 s (smaller shapes, fewer points)
#   validation, llama3-8b     ~110-170 s expected, killed when BUDGET_S is spent (at least 60 s):
#                             ~50 s to draw 8 B random weights on the CPU (one seeded generator,
#                             ~6 ns a value here), four engine runs of 48 requests (lockstep, wall
#                             clock, replay, noise run: ~300 steps each at ~15-25 ms, the Python
#                             and launch cost of 32 layers, above the ~4 ms of weight reads), the
#                             no-paging reference (~2,600 one-sequence forward passes: ~25-45 s),
#                             the simulator and the figures
# So a llama3-8b calibration done by ~250 s leaves >= 220 s to validate; one that overruns is
# followed by the fallback's, done by ~370 s, and validating llama-350m (0.4 B weights, 24 layers)
# takes well under the ~110 s left. On a 15-minute device lease: one call (timeout_s 600), no rerun.

# Nothing is installed there: the image's python3 (PYTHON) must have torch, triton, numpy and
# matplotlib; this package is used from the working tree (PYTHONPATH). simpy is not on that image:
# carry it as a wheel (here: python3 -m pip download --no-deps --only-binary=:all: -d .whl simpy==4.1.2,
# and name .whl in the run's carry); wheels in WHEELS (.whl) are installed when an import is missing.
#
# --smoke: the same path on the CPU in well under a minute, to keep the script from rotting (CI):
# tiny (float64, torch kernels) calibrated with --quick --repeats 1 --warmup 0, validated on 12
# requests; OUT defaults to a new temporary folder. Its figures mean nothing.
#
# Exit status: 0 when the calibration and the validation succeeded, validation.json,
# validation.pdf and the profile exist and validation.json says decision_logs_identical and
# outputs_match_reference; else the failing command's status (124: killed at its time limit), or 1.
set -euo pipefail

SMOKE=0
for arg in "$@"; do
    case "$arg" in
        --smoke) SMOKE=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_validate: unknown argument $arg (usage: OUT=DIR bash benchmarks/gpu_validate.sh [--smoke])" >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-.whl}"
if [[ "$SMOKE" -eq 1 ]]; then
    OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-validate-smoke.XXXXXX")}"
    MODEL="${MODEL:-tiny}"
    FALLBACK_MODEL="${FALLBACK_MODEL:-tiny}"
    DEVICE_ARGS=(--device cpu)
    CAL_ARGS="${CAL_ARGS:---quick --repeats 1 --warmup 0}"
    BUDGET_S="${BUDGET_S:-400}"  # the CI machine is shared: generous limits, a hung run still ends
    CAL_TIMEOUT="${CAL_TIMEOUT:-120}"
    FALLBACK_CAL_TIMEOUT="${FALLBACK_CAL_TIMEOUT:-120}"
    VAL_REQUESTS="${VAL_REQUESTS:-12}"
else
    OUT="${OUT:-benchmarks/results}"
    MODEL="${MODEL:-llama3-8b}"
    FALLBACK_MODEL="${FALLBACK_MODEL:-llama-350m}"
    DEVICE_ARGS=(--device cuda --dtype bfloat16 --backend triton)
    CAL_ARGS="${CAL_ARGS:---quick}"
    BUDGET_S="${BUDGET_S:-480}"
    CAL_TIMEOUT="${CAL_TIMEOUT:-240}"
    FALLBACK_CAL_TIMEOUT="${FALLBACK_CAL_TIMEOUT:-100}"
    VAL_REQUESTS="${VAL_REQUESTS:-48}"
fi
VAL_WORKLOAD="${VAL_WORKLOAD:-kwon2023-alpaca}"
VAL_RATE="${VAL_RATE:-16}"
VAL_ARGS="${VAL_ARGS:-}"  # extra validate options, e.g. "--num-gpu-blocks 256"
mkdir -p "$OUT"
rm -rf "$OUT/validation" "$OUT/timings.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
echo "gpu_validate: writing into $OUT" | tee "$OUT/log.txt"
# pagesim's own entry point (engine.cli:main), which nothing installed provides there
PAGESIM=("$PYTHON" -c 'import sys; from pagesim.engine.cli import main; sys.exit(main())')
script_start=$(date +%s.%N)

seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

note() { echo "gpu_validate: $*" | tee -a "$OUT/log.txt"; }

# run_phase LABEL LIMIT_S COMMAND...: COMMAND under a time limit, its output into log.txt, its wall
# time and exit status into timings.txt; the status is left in phase_rc.
run_phase() {
    local label=$1 limit=$2 t0
    shift 2
    t0=$(date +%s.%N)
    phase_rc=0
    timeout -k 15 "$limit" "$@" 2>&1 | tee -a "$OUT/log.txt" || phase_rc=$?
    printf '%-32s %7s s  %s\n' "$label" "$(seconds_since "$t0")" "$(why "$phase_rc" "$limit")" \
        | tee -a "$OUT/timings.txt"
}

why() { if [[ "$1" -eq 124 ]]; then echo "killed at its $2 s limit"; else echo "exit $1"; fi; }

finish() {  # finish STATUS [SUMMARY]: the timings' total, the summary line last, then exit
    printf '%-32s %7s s\n' "total" "$(seconds_since "$script_start")" | tee -a "$OUT/timings.txt"
    if [[ -n "${2:-}" ]]; then echo "$2" | tee -a "$OUT/log.txt"; fi
    exit "$1"
}

# -- the image's packages: wheels carried in $WHEELS fill in what is missing
missing_imports() { "$PYTHON" - <<'PY'
import importlib.util
print(" ".join(m for m in ("torch", "numpy", "simpy", "matplotlib", "tqdm") if importlib.util.find_spec(m) is None))
PY
}
missing=$(missing_imports)
if [[ -n "$missing" ]] && compgen -G "$WHEELS/*.whl" > /dev/null; then
    site="${TMPDIR:-/tmp}/pagesim-site"
    note "missing: $missing; installing the wheels in $WHEELS into $site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$WHEELS"/*.whl
    export PYTHONPATH="$PYTHONPATH:$site"
    missing=$(missing_imports)
fi
if [[ -n "$missing" ]]; then
    note "error: $PYTHON cannot import: $missing (carry wheels in $WHEELS: see this script's header)"
    exit 2
fi

# -- env.txt
t0=$(date +%s.%N)
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "mode: $([[ "$SMOKE" -eq 1 ]] && echo "smoke (CPU)" || echo GPU)"
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi: failed"
    else
        echo "nvidia-smi: not available"
    fi
    "$PYTHON" - <<'PY' 2>&1 || echo "python: torch/triton/numpy versions unavailable"
import platform

import numpy
import torch

try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "missing"
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton_version, "numpy", numpy.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "sms", p.multi_processor_count, "memory_gib", round(p.total_memory / 2**30, 1))
PY
} 2>&1 | tee "$OUT/env.txt"
if [[ "$SMOKE" -eq 1 ]]; then
    gpu=cpu
else
    gpu=$("$PYTHON" -c "import re, torch; n = torch.cuda.get_device_name(0); m = re.search(r'\b([A-Z]+[0-9]+[A-Za-z]*)\b', n.replace('NVIDIA', '')); print((m.group(1) if m else n.split()[-1]).lower())" 2>/dev/null || echo gpu)
fi
printf '%-32s %7s s\n' "env" "$(seconds_since "$t0")" | tee -a "$OUT/timings.txt"

# -- calibration, with one fallback
calibrate() {  # calibrate MODEL LIMIT_S: sets profile, cal_limit and phase_rc
    profile="$OUT/$1-$gpu.json"
    cal_limit=$2
    # shellcheck disable=SC2086 # CAL_ARGS is split into options on purpose
    run_phase "calibrate $1" "$2" "${PAGESIM[@]}" calibrate "${DEVICE_ARGS[@]}" --model "$1" $CAL_ARGS \
        --out "$profile" --force --no-progress
}

model=$MODEL
calibrate "$model" "$CAL_TIMEOUT"
if [[ "$phase_rc" -ne 0 && -n "$FALLBACK_MODEL" && "$FALLBACK_MODEL" != "none" && "$FALLBACK_MODEL" != "$MODEL" ]]; then
    # the first of FALLBACK_MODEL, llama-125m, small that names a preset here, other than MODEL
    fallback=$("$PYTHON" - "$MODEL" "$FALLBACK_MODEL" llama-125m small <<'PY' 2> >(tee -a "$OUT/log.txt" >&2)
import sys

from pagesim.engine.model.weights import model_config

for name in dict.fromkeys(sys.argv[2:]):
    if name == sys.argv[1]:
        continue
    try:
        model_config(name)
    except ValueError:
        print(f"gpu_validate: fallback {name} does not name a model preset here; trying the next", file=sys.stderr)
        continue
    print(name)
    break
PY
    ) || true
    if [[ -z "$fallback" ]]; then
        finish "$phase_rc" "gpu_validate: calibration of $model failed ($(why "$phase_rc" "$cal_limit")) and no fallback model resolves"
    fi
    note "calibration of $model failed ($(why "$phase_rc" "$cal_limit")): calibrating $fallback instead"
    model=$fallback
    calibrate "$model" "$FALLBACK_CAL_TIMEOUT"
fi
cal_rc=$phase_rc
if [[ "$cal_rc" -ne 0 ]]; then
    finish "$cal_rc" "gpu_validate: calibration of $model failed ($(why "$cal_rc" "$cal_limit")): nothing to validate"
fi

# -- validation, in what is left of the budget (at least 60 s)
val_limit=$(awk -v budget="$BUDGET_S" -v spent="$(seconds_since "$script_start")" \
    'BEGIN { left = budget - spent; printf "%d", (left < 60 ? 60 : left) }')
# shellcheck disable=SC2086 # VAL_ARGS is split into options on purpose
run_phase "validate $model" "$val_limit" "${PAGESIM[@]}" validate --model "$model" --profile "$profile" \
    --workload "$VAL_WORKLOAD" --rate "$VAL_RATE" --num-requests "$VAL_REQUESTS" --noise-runs 1 \
    --out "$OUT/validation" $VAL_ARGS
val_rc=$phase_rc

# -- what came out: the files, the two booleans, a one-line summary
summary_rc=0
summary=$("$PYTHON" - "$OUT" "$model" "$gpu" "$profile" <<'PY'
import json
import sys
from pathlib import Path

out, model, gpu, profile = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
missing = [str(p) for p in (profile, out / "validation" / "validation.json", out / "validation" / "validation.pdf")
           if not p.is_file()]
if missing:
    print(f"gpu_validate: {model} on {gpu}: missing {', '.join(missing)}")
    sys.exit(1)
r = json.loads((out / "validation" / "validation.json").read_text())


def pct(x):
    return "n/a" if x is None else f"{x:+.1%}"


check = r.get("profile_check") or {}
ratio = check.get("probe_ratio")
probe = "n/a" if ratio is None else f"{ratio:.2f}x per point ({'within' if check.get('probe_ok') else 'NOT within'} {check.get('tolerance', 0):.0%})"
mape = r.get("step_time_mape")
print(f"gpu_validate: {model} on {gpu}: decisions identical {r['decision_logs_identical']}, outputs match reference "
      f"{r['outputs_match_reference']}, step MAPE {'n/a' if mape is None else f'{mape:.1%}'}, TPOT mean "
      f"{pct(r['tpot']['mean_error'])}, e2e mean {pct(r['e2e']['mean_error'])}, profile probe {probe}")
sys.exit(0 if r["decision_logs_identical"] is True and r["outputs_match_reference"] is True else 1)
PY
) || summary_rc=$?
if [[ "$val_rc" -ne 0 ]]; then
    note "validation of $model failed ($(why "$val_rc" "$val_limit"))"
    finish "$val_rc" "$summary"
fi
finish "$summary_rc" "$summary"
