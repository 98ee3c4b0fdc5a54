#!/usr/bin/env bash
# Calibrate Llama 3 8B shapes (bfloat16, Triton kernels) on the device machine's GPU, into $OUT.
#
# Run from the repository root: OUT=some/folder bash benchmarks/gpu_calibrate.sh
# Nothing is installed: the image's python3 must have torch, triton and numpy; this package is
# used from the working tree (PYTHONPATH). Writes $OUT/env.txt, $OUT/calibrate_log.txt and
# $OUT/llama3-8b-<gpu>.json (the profile; commit it under pagesim/sim/profiles/). The run is killed at
# CAL_TIMEOUT (450 s, inside the 8 minutes the issue allows); the profile is saved after every
# table, so running the script again resumes it. Exit status: the calibration's.
set -euo pipefail

OUT="${OUT:-benchmarks/results}"
CAL_TIMEOUT="${CAL_TIMEOUT:-450}"
MODEL="${MODEL:-llama3-8b}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi: not available"
    python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/env.txt"
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())" 2>/dev/null || echo gpu)
profile="$OUT/$MODEL-$gpu.json"
rc=0
timeout "$CAL_TIMEOUT" python3 - "$MODEL" "$profile" <<'PY' 2>&1 | tee "$OUT/calibrate_log.txt" || rc=$?
import argparse
import sys

from pagesim.engine.calibrate import cli

parser = argparse.ArgumentParser(prog="pagesim")
cli.add_parser(parser.add_subparsers())
args = parser.parse_args(["calibrate", "--device", "cuda", "--model", sys.argv[1], "--dtype", "bfloat16",
                          "--out", sys.argv[2], "--no-progress"])
sys.exit(args.func(args))
PY
echo "calibration exit status: $rc (124 = killed by timeout after ${CAL_TIMEOUT} s; run again to resume)"
exit "$rc"
