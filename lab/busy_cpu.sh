#!/usr/bin/env bash
# The CPU recipe's training step alone, beside one busy core and beside a second step benchmark, with 2 threads
# (trainer.threads=auto before it read the load) and with the count the load rule gives (docs/BENCHMARKS.md,
# "A busy CPU"). Prints one line per measurement: case | setting | condition | img/s (the second run's too).
#   bash lab/busy_cpu.sh [cases...]      (default: the recipe's two widths in fp32 and bf16)
#   bash lab/busy_cpu.sh eval <checkpoint> <data.root> [amp...]   (vit-eval's whole pass, loader included; default
#                                                                  amp: none and bf16)
set -euo pipefail
if [ "${1:-}" = "--help" ]; then sed -n 2,7p "$0"; exit 0; fi
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${1:-}" = "eval" ]; then
    ckpt=$2; root=$3; shift 3; amps=("$@"); [ ${#amps[@]} -gt 0 ] || amps=(none bf16)
    ev() { o=$(mktemp); "$(dirname "$PY")/vit-eval" checkpoint="$ckpt" data.root="$root" amp=$1 threads=$2 json="$o" \
        > /dev/null 2>&1; $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['images_per_s'])" "$o"; rm -f "$o"; }
    for amp in "${amps[@]}"; do
        c="eval $(basename "$(dirname "$(dirname "$ckpt")")") amp=$amp"
        for threads in 2 auto; do echo "$c | threads=$threads | alone | $(ev $amp $threads)"; done
        python3 -c "while True: pass" & loop=$!
        sleep 1
        for threads in 2 auto; do echo "$c | threads=$threads | beside a busy core | $(ev $amp $threads)"; done
        kill $loop
        for threads in 2 1; do
            a=$(mktemp); ev $amp $threads > "$a" & first=$!
            b=$(ev $amp $threads); wait $first
            echo "$c | threads=$threads each | beside a second run | $(cat "$a") + $b"; rm -f "$a"
        done
    done
    exit 0
fi
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=("vit_cpu_recipe_96 amp=none" "vit_cpu_recipe_96 amp=bf16" "vit_cpu_recipe_144 amp=none" "vit_cpu_recipe_144 amp=bf16")
bench() { $PY lab/benchmark.py models=$1 device=cpu rounds=3 warmup=3 threads=$2 2>&1 | tail -1 | awk -F'|' '{gsub(/ /,"",$7); print $7}'; }
for c in "${cases[@]}"; do
    for threads in 2 auto; do echo "$c | threads=$threads | alone | $(bench "$c" $threads)"; done
    python3 -c "while True: pass" & loop=$!
    sleep 1
    for threads in 2 auto; do echo "$c | threads=$threads | beside a busy core | $(bench "$c" $threads)"; done
    kill $loop
    for threads in 2 1; do  # two runs at once: each with 2 threads, then each with the 1 the rule settles on
        a=$(mktemp); bench "$c" $threads > "$a" & first=$!
        b=$(bench "$c" $threads); wait $first
        echo "$c | threads=$threads each | beside a second run | $(cat "$a") + $b"; rm -f "$a"
    done
done
