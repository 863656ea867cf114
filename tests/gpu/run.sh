#!/usr/bin/env bash
# The GPU proof kit (docs/gpu.md): `bash tests/gpu/run.sh OUT_DIR` on the GPU machine (about 8 minutes at most),
# `bash tests/gpu/run.sh OUT_DIR --device cpu --dry-run` anywhere (tiny sizes, no install). Each part runs under
# its own `timeout` and writes OUT_DIR/<part>.json + .md as it goes; OUT_DIR/SUMMARY.md gathers them at the end.
# PYTHON picks the interpreter (default: python3, the device image's).
set -u
OUT=${1:?usage: bash tests/gpu/run.sh OUT_DIR [--device cpu --dry-run]}
shift
DEVICE=cuda
DRY=""
while [ $# -gt 0 ]; do
    case $1 in
        --device) DEVICE=$2; shift 2 ;;
        --dry-run) DRY=--dry-run; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
export TASKFIT_DEEPSPEED_SHM_COMM=${TASKFIT_DEEPSPEED_SHM_COMM:-$([ "$DEVICE" = cpu ] && echo 0 || echo 1)}
# seconds per part (ceilings; the parts usually end sooner): 450 s in all on the GPU, leaving room in 9 minutes
declare -A LIMIT=([install]=40 [env]=20 [pytest]=70 [matrix]=100 [dist]=60 [checks]=50 [perf]=80 [techniques]=30)
# the dry run: a shared 2-core CPU is far slower than the GPU machine; scale every ceiling (KIT_LIMIT_SCALE)
SCALE=${KIT_LIMIT_SCALE:-$([ -n "$DRY" ] && echo 4 || echo 1)}
for k in "${!LIMIT[@]}"; do LIMIT[$k]=$(( LIMIT[$k] * SCALE )); done
echo "bash tests/gpu/run.sh $OUT --device $DEVICE $DRY  (git $(git rev-parse --short HEAD 2>/dev/null || echo '?'))" \
    > "$OUT/command.txt"
: > "$OUT/parts.txt"
START=$(date +%s)
echo "GPU proof kit: device=$DEVICE ${DRY:-full run}, out=$OUT; budget (s): $(for k in "${!LIMIT[@]}"; do printf '%s=%s ' "$k" "${LIMIT[$k]}"; done)"

part() {  # part NAME COMMAND...: run under LIMIT[NAME], log to OUT/NAME.log, record rc and seconds
    local name=$1 t0 rc
    shift
    t0=$(date +%s)
    timeout -k 5 "${LIMIT[$name]}" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "| $name | rc=$rc$([ $rc = 124 ] && echo ' (time limit)') | $(( $(date +%s) - t0 )) s of ${LIMIT[$name]} |" \
        | tee -a "$OUT/parts.txt"
}

if [ -z "$DRY" ]; then
    part install bash -c "$PY -m pip install -q --no-deps --no-index --no-build-isolation . \
        || $PY -m pip install -q --no-deps --no-index --find-links gpu-wheels . ; $PY tests/gpu/wheels.py install gpu-wheels"
fi
if [ -z "$DRY" ]; then
    part env "$PY" tests/gpu/kit.py env --device "$DEVICE" --out "$OUT"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUT/env.log" 2>&1
    cat "$OUT/env.md"
fi
mapfile -t CUDA_TESTS < <(grep -rl "pytest.mark.cuda" tests --include="test_*.py" | sort)
part pytest "$PY" -m pytest -q -p no:cacheprovider -m cuda --junitxml "$OUT/pytest.xml" "${CUDA_TESTS[@]}"
"$PY" tests/gpu/kit.py pytest --device "$DEVICE" --out "$OUT" --junit "$OUT/pytest.xml" $DRY > /dev/null 2>&1
if [ -z "$DRY" ]; then
    for name in matrix dist checks perf; do
        part "$name" "$PY" tests/gpu/kit.py "$name" --device "$DEVICE" --out "$OUT"
    done
else  # one process for the rows (an interpreter with torch and transformers costs seconds of CPU on its own);
    # dist last: its DDP row leaves a process group behind
    LIMIT[rows]=$(( LIMIT[env] + LIMIT[matrix] + LIMIT[dist] + LIMIT[checks] + LIMIT[perf] ))
    part rows "$PY" tests/gpu/kit.py env matrix checks perf dist --device "$DEVICE" --out "$OUT" $DRY
    cat "$OUT/env.md"
fi
ONLY=$([ -n "$DRY" ] && echo "--only baseline" || echo "")
part techniques "$PY" -m benchmarks techniques --quick --device "$DEVICE" --out "$OUT/techniques" $ONLY

{
    echo "# GPU proof kit: $(date -u +%Y-%m-%d) on $DEVICE${DRY:+ (dry run)}"
    echo
    echo "Command: \`$(cat "$OUT/command.txt")\`; $(( $(date +%s) - START )) s in all."
    echo
    echo "| part | exit | time |"
    echo "|---|---|---|"
    cat "$OUT/parts.txt"
    echo
    for name in env pytest matrix dist checks perf; do [ -f "$OUT/$name.md" ] && cat "$OUT/$name.md" && echo; done
    [ -f "$OUT/techniques/results.md" ] && cat "$OUT/techniques/results.md"
} > "$OUT/SUMMARY.md"
echo "done in $(( $(date +%s) - START )) s: $OUT/SUMMARY.md"
# non-zero when a part failed or ran out of time, or a row failed
grep -q "rc=[1-9]" "$OUT/parts.txt" && exit 1
grep -h '"status": "fail"' "$OUT"/*.json > /dev/null && exit 1
exit 0
