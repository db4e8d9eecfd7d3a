#!/usr/bin/env bash
# One step of the GPU checks on a machine with one NVIDIA GPU, each step within a time limit and
# with everything it measures written under $OUT (default outputs/gpu-session):
#
#   bash ci/gpu-session.sh tests  [SECONDS] [pytest args]     the CUDA tests (tests/test_cuda.py)
#   bash ci/gpu-session.sh bench  [SECONDS] [bench args]      throughput, MFU, memory, decoding,
#                                                             eager and compiled, beside plain PyTorch
#   bash ci/gpu-session.sh table2 [SECONDS] [overrides]       reproduce table2 --scale gpu
#   bash ci/gpu-session.sh depth  [SECONDS] [overrides]       reproduce tfixup-depth --scale gpu
#   bash ci/gpu-session.sh call   [SECONDS] [overrides]       the prepared call of a lent GPU: the
#                                                             CUDA tests without a passing GPU run
#                                                             (TESTS_K; TESTS_LIMIT s,
#                                                             default 150; 0: none), then the GPU
#                                                             tier's pool (TARGET, default table2;
#                                                             SCALE=real: a real-tier suite, with
#                                                             trainer.device=cuda; --parallel auto)
#                                                             until 30 s before SECONDS; with
#                                                             BUNDLE=call, one file comes back
#
# SECONDS (default 540) bounds the step: at the limit the step gets SIGINT (SIGKILL 15 s later), so a reproduce step
# stops its cells with a checkpoint and the same command resumes them. A reproduce step also gives
# its pool a deadline 30 s inside the limit (`deepinit reproduce --deadline`): no cell starts that
# is not expected to finish by then. The reproduce steps keep
# their records in results/<target>/gpu/ of this checkout (the call step's with SCALE=real in
# results/<target>/real/; a variant's, made by overrides that change the preset's cells, beside
# its run folders in $RUNS/<target>-<tier>/) and copy them to $OUT.
# Environment:
#   PARALLEL=N            cells sharing the GPU in the reproduce steps (default 1; call: auto)
#   TARGET, SCALE         the call step's suite (default table2) and tier (gpu, the default, or
#                         real: a CPU tier's suite trained on the GPU, given trainer.device=cuda)
#   PRESETS, REPS         the bench step's entries, one call and one JSON each (default "base
#                         small big base-18 depth"; depth: the depth-scaling entries alone, eager)
#                         and alternating runs per side (default 3)
#   DEPTHS, COMPILE       the depth entries' layers per stack (default "6 50 100 200") and the
#                         presets' --compile (default both: eager and compiled)
#   RUNS                  the reproduce steps' run folders (default outputs/reproduce)
#   DEEPINIT_RESULTS      the records' root (default results of this checkout)
#   DEEPINIT_DATA_ROOT    the folder holding multi30k/ (default .gpudata of this checkout)
#   PYTHON                the interpreter (default .venv/bin/python when there is one, else python3)
#   BUNDLE=NAME           write the step's files to a scratch folder and pack them, at the end or
#                         at an early exit, into $OUT/NAME.tgz: one file for a machine that hands
#                         back only a few
# When .whl/device-env.sh exists (a machine without the Python packages: wheels carried beside the
# checkout) it is sourced first. When .whl/COMMIT exists (written before the call from a clean
# checkout: `git rev-parse HEAD > .whl/COMMIT`), it names the commit in every record
# (DEEPINIT_GIT_COMMIT): the GPU machine's copy can carry an older .git than the code it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: bash ci/gpu-session.sh tests|bench|table2|depth|call [SECONDS] [args]}
limit=${2:-540}
shift $(( $# < 2 ? $# : 2 ))
out=${OUT:-outputs/gpu-session}
mkdir -p "$out"
if [ -n "${BUNDLE:-}" ]; then
  bundle="$(cd "$out" && pwd)/$BUNDLE.tgz"
  out=$(mktemp -d)
  trap 'tar czf "$bundle" -C "$out" . && rm -rf "$out"' EXIT
fi
if [ -f .whl/device-env.sh ]; then . .whl/device-env.sh; fi
if [ -f .whl/COMMIT ]; then export DEEPINIT_GIT_COMMIT=$(cat .whl/COMMIT); fi
export DEEPINIT_DATA_ROOT=${DEEPINIT_DATA_ROOT:-$PWD/.gpudata}
export COLUMNS=${COLUMNS:-160}  # rich tables in the logs at full width

# A tier's records into $OUT ($1 the target, $2 the tier, default gpu): results/<target>/<tier>
# as $OUT/<target>-<tier>, and those of overrides that change the preset's cells (a variant, kept
# beside the run folders) as $OUT/<target>-<tier>-variant.
copy_records() {
  local tier="${2:-gpu}"
  local records="${DEEPINIT_RESULTS:-results}/$1/$tier" variant="${RUNS:-outputs/reproduce}/$1-$tier"
  if [ -d "$records" ]; then cp -r "$records" "$out/$1-$tier"; fi
  if [ -f "$variant/records.jsonl" ]; then
    mkdir -p "$out/$1-$tier-variant"
    cp "$variant"/records.jsonl "$variant"/report.md "$out/$1-$tier-variant/"
    cp "$variant"/*.png "$out/$1-$tier-variant/" 2>/dev/null || true
  fi
}
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3)}
# the commit, and how many tracked files differ from it: a copied checkout may carry an older .git
{ date -u +"%Y-%m-%dT%H:%M:%SZ"; git rev-parse HEAD 2>/dev/null || true
  echo "tracked files changed since that commit: $(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
  echo "commit named by .whl/COMMIT: ${DEEPINIT_GIT_COMMIT:-none}"
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"; } > "$out/machine-$step.txt"

case "$step" in
  tests)
    timeout -k 15 -s INT "$limit" "$python" -m pytest -m cuda -v -rs tests/test_cuda.py \
      --junitxml "$out/cuda-tests.xml" "$@" 2>&1 | tee "$out/cuda-tests.log"
    ;;
  bench)
    rc=0
    # one call and one JSON per preset, so a step cut short by its limit keeps the finished ones
    deadline=$(( $(date +%s) + limit ))
    # a preset's call leaves the depth entries out (--depths with no value); "depth" is a call of them alone
    for preset in ${PRESETS:-base small big base-18 depth}; do
      left=$(( deadline - $(date +%s) ))
      if [ "$left" -lt 30 ]; then echo "gpu-session: no time left for $preset" | tee -a "$out/bench.log"; break; fi
      if [ "$preset" = depth ]; then
        # shellcheck disable=SC2086  # DEPTHS is a list of numbers
        entries=(--depths ${DEPTHS:-6 50 100 200} --presets)
      else
        entries=(--depths --presets "$preset" --compile "${COMPILE:-both}" --reference --reps "${REPS:-3}")
      fi
      # a failed call does not stop the next one; the step's status is the last failure's
      timeout -k 15 -s INT "$left" "$python" -m runner.cli bench "${entries[@]}" --out "$out/bench-$preset.json" \
        "$@" 2>&1 | tee -a "$out/bench.log" || rc=$?
    done
    exit "$rc"
    ;;
  table2|depth)
    target=$([ "$step" = table2 ] && echo table2 || echo tfixup-depth)
    rc=0
    # the pool's own deadline, 30 s inside the limit: it starts no cell that would end after it
    # (the suite's measured time per cell, else the preset's) and stops the running ones itself,
    # leaving the rest of the limit for the report
    timeout -k 15 -s INT "$limit" "$python" -m runner.cli reproduce "$target" --scale gpu \
      --parallel "${PARALLEL:-1}" --out "${RUNS:-outputs/reproduce}" --deadline "$(( limit > 60 ? limit - 30 : limit ))" \
      "$@" 2>&1 | tee "$out/$target.log" || rc=$?
    copy_records "$target"
    exit "$rc"
    ;;
  call)
    # One prepared call (a GPU lent for minutes): first the CUDA tests without a passing GPU run
    # (by default the layer-scope compile test; TESTS_K picks others), bounded, then the GPU
    # tier's next cells (SCALE=real: a real-tier suite's, with trainer.device=cuda among the
    # overrides) with the count at once chosen from the records or by the probe, each started
    # only when it will end before the deadline. Rehearsed on
    # CPU by tests/tables/test_suite.py with trainer.device=cpu and tiny overrides: on a GPU the
    # device differs, and each cell has one CPU thread (on the CPU, the cores shared out).
    start=$(date +%s)
    case "${TESTS_LIMIT:-150}" in
      ''|*[!0-9]*) echo "gpu-session: TESTS_LIMIT must be whole seconds, got '${TESTS_LIMIT}'" >&2; exit 2 ;;
    esac
    scale=${SCALE:-gpu}
    case "$scale" in  # checked before the tests spend any of the call
      gpu|real) ;;
      *) echo "gpu-session: SCALE must be gpu or real, got '$scale'" >&2; exit 2 ;;
    esac
    if [ "${TESTS_LIMIT:-150}" -gt 0 ]; then  # TESTS_LIMIT=0: the whole call for the pool
      timeout -k 15 -s INT "${TESTS_LIMIT:-150}" "$python" -m pytest -m cuda -v -rs tests/test_cuda.py \
        -k "${TESTS_K:-compile and layers}" -p no:xdist --junitxml "$out/cuda-tests.xml" \
        2>&1 | tee "$out/cuda-tests.log" || echo "gpu-session: the CUDA tests ended with status $?" | tee -a "$out/cuda-tests.log"
    fi
    target=${TARGET:-table2}
    left=$(( limit - ($(date +%s) - start) ))
    if [ "$left" -lt 60 ]; then echo "gpu-session: ${left} s left, no time for the $target pool" | tee "$out/$target.log"; exit 1; fi
    rc=0
    timeout -k 15 -s INT "$left" "$python" -m runner.cli reproduce "$target" --scale "$scale" \
      --parallel "${PARALLEL:-auto}" --out "${RUNS:-outputs/reproduce}" --deadline "$(( left - 30 ))" \
      --bundle "$out/$target-$scale.tgz" "$@" 2>&1 | tee "$out/$target.log" || rc=$?
    # the records also as files of their own: a pool stopped by the limit before it packed its
    # bundle still hands back every cell it recorded
    copy_records "$target" "$scale"
    exit "$rc"
    ;;
  *)
    echo "gpu-session: unknown step '$step' (expected tests, bench, table2, depth or call)" >&2
    exit 2
    ;;
esac
