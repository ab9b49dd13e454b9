#!/usr/bin/env bash
# Time a test tier and measure its line coverage, writing what pytest printed under a header that says where it ran:
#   scripts/measure_tests.sh OUTPUT.txt [pytest arguments...]     (from the repository root, after `make install serve-env`)
# e.g. scripts/measure_tests.sh benchmarks/results/test_durations.txt -n 2 --dist loadfile -m "not slow and not gpu and not trt"
# The file holds the commit, the CPU and its ISA, the command, pytest's --durations=0 table, the coverage table of
# deploytk/, plugins/ and serving/, pytest's closing line and the wall time. Coverage slows Python-heavy tests by a few
# percent: the wall time of `make test` itself is measured without it (CONTRIBUTING.md says which run gave which figure).
set -uo pipefail
out=${1:?usage: scripts/measure_tests.sh OUTPUT.txt [pytest arguments...]}
shift
python=${PYTHON:-.venv/bin/python}
isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile)$' | tr '\n' ' ')
cmd=("$python" -m pytest -q -p no:cacheprovider --durations=0 --cov=deploytk --cov=deploytk_plugins --cov=serving
     --cov-report=term "$@")
{
  echo "# deploytk test tier: durations and coverage"
  echo "# commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!benchmarks/results' || echo ' (with uncommitted changes)')"
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, ISA: ${isa:-unknown}"
  echo "# command: DEPLOYTK_REQUIRE_SERVER=1 $(printf '%q ' "${cmd[@]}")"
} > "$out.tmp"
start=$(date +%s)
DEPLOYTK_REQUIRE_SERVER=1 "${cmd[@]}" 2>&1 | tee -a "$out.tmp"
rc=${PIPESTATUS[0]}
echo "# wall: $(( $(date +%s) - start )) s, pytest exit code $rc" >> "$out.tmp"
mv "$out.tmp" "$out"
exit "$rc"
