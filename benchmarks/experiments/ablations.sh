#!/usr/bin/env bash
# Ablations (CPU, bf16, 2 threads); every step is resumable and skips what is done. Results go
# to benchmarks/results/ablations/; ablation_report.py turns them into the README's tables.
#
#     bash benchmarks/experiments/ablations.sh trees   # chain vs tree (paper Table 5): bench runs on MT-bench
#     bash benchmarks/experiments/ablations.sh heads   # SmolLM2 heads at one budget: the input variants (Fig. 8),
#                                          # and 1 vs 2 decoder layers
#     bash benchmarks/experiments/ablations.sh data    # fixed vs target-generated training data (Table 6)
#     bash benchmarks/experiments/ablations.sh objectives  # SmolLM2 heads at one time budget each: EAGLE-1's loss vs
#                                          # the token-level objectives, 1 / 3 / 5 unrolled steps
#                                          # (training-time test), EAGLE-1 vs EAGLE-3
#     BUDGET=30 bash benchmarks/experiments/ablations.sh quality  # the same comparisons, and human vs own vs mixed
#                                          # answers, on the target's own answers, with n-alpha on both
#                                          # kinds of text and MT-bench tau and speedup per head
set -euo pipefail
cd "$(dirname "$0")/../.."
E=.venv/bin/eaglespec
M=smollm2-135m-instruct
CACHE=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}
F=$CACHE/features
RUNS=$CACHE/runs/ablations
OUT=benchmarks/results/ablations
mkdir -p "$OUT" "$RUNS"
# one training budget for every head: EPOCHS epochs over the same features
EPOCHS=2
RECIPE=(--lr 5e-4 --warmup-steps 20 --batch 8 --draft-vocab 8192 --eval-limit 50
        --checkpoint-every 20 --threads 2)

train() {  # NAME TRAIN_FEATURES [train options]: train (resumably) and keep the run folder
    local name=$1 features=$2
    shift 2
    [[ -f "$RUNS/$name/head/config.json" ]] || \
        $E train --model $M --train-features "$features" --heldout-features "$F/smollm2-heldout" \
            --out "$RUNS/$name" --epochs $EPOCHS "${RECIPE[@]}" "$@"
    mkdir -p "$OUT/heads" && cp "$RUNS/$name/head/config.json" "$OUT/heads/$name.json"
}

bench() {  # NAME [bench options]
    local name=$1
    shift
    [[ -f "$OUT/$name.json" ]] || $E bench --model $M --threads 2 --max-new-tokens 128 --out "$OUT/$name.json" "$@"
}

case "${1:?usage: ablations.sh trees|heads|data|objectives|quality}" in
    trees)
        for T in 0 1; do
            bench "trees-mt-bench-t$T" --head default --dataset mt-bench --limit 10 --temperature $T \
                --methods vanilla,eagle:chain:1,eagle:chain:2,eagle:chain:4,eagle:chain:6,eagle:eagle1,eagle:dynamic,eagle:auto
        done ;;
    heads)
        for variant in feature+shifted-token feature+unshifted-token feature token; do
            train "variant-$variant" "$F/smollm2-train" --input-variant "$variant"
        done
        train layers-2 "$F/smollm2-train" --layers 2
        # decoding reads only the paper's variant, so 1 vs 2 layers is also measured end to end
        bench layers-1-mt-bench-t0 --head "$RUNS/variant-feature+shifted-token/head" --dataset mt-bench \
            --limit 10 --methods vanilla,eagle:chain:4,eagle:auto
        bench layers-2-mt-bench-t0 --head "$RUNS/layers-2/head" --dataset mt-bench --limit 10 \
            --methods vanilla,eagle:chain:4,eagle:auto ;;
    data)
        # the same 120 training conversations (431 assistant turns), with their ShareGPT answers and
        # with SmolLM2's own greedy ones (up to 512 tokens each; the regeneration is the long step,
        # about an hour on 2 cores)
        $E extract --model $M --data sharegpt --split train --limit 120 --out "$F/smollm2-fixed120" --threads 2
        $E regenerate --model $M --limit 120 --turns 0 --max-prompt-tokens 2048 --method vanilla \
            --out "$CACHE/data/smollm2-regen120" --threads 2
        $E extract --model $M --data "$CACHE/data/smollm2-regen120" --split train --limit 120 \
            --out "$F/smollm2-regen120" --threads 2
        EPOCHS=6  # more epochs over the smaller set
        train data-fixed "$F/smollm2-fixed120"
        train data-regenerated "$F/smollm2-regen120"
        for data in fixed regenerated; do
            bench "data-$data-mt-bench-t0" --head "$RUNS/data-$data/head" --dataset mt-bench --limit 10 \
                --methods vanilla,eagle:chain:4,eagle:auto
        done ;;
    objectives)
        # the same features (with the hidden states an EAGLE-3 head reads) and BUDGET minutes of
        # training each (CPU time per thread: runs that share the CPU still get equal budgets), the
        # lr decaying to 0 at the budget; fp32 target forwards for extraction (faster than bf16 on
        # CPUs without bf16 instructions). Heads land in objectives-BUDGETmin/.
        BUDGET=${BUDGET:-20}
        A=(--aux-layers eagle3 --dtype float32 --threads 2)
        $E extract --model $M --data sharegpt --split heldout --limit 100 "${A[@]}" --out "$F/smollm2-aux-heldout"
        $E extract --model $M --data sharegpt --split train --limit 192 "${A[@]}" --out "$F/smollm2-aux-train192"
        budget() {  # NAME [train options]
            local name=$1
            shift
            $E train --model $M --train-features "$F/smollm2-aux-train192" --heldout-features "$F/smollm2-aux-heldout" \
                --out "$RUNS/$name-${BUDGET}min" --epochs 1000 --budget-minutes "$BUDGET" "${RECIPE[@]}" "$@"  # a finished run returns at once
            mkdir -p "$OUT/objectives-${BUDGET}min" && cp "$RUNS/$name-${BUDGET}min/head/config.json" "$OUT/objectives-${BUDGET}min/$name.json"
        }
        budget obj-eagle1                                   # feature:1,ce:0.1, one step (EAGLE-1)
        budget unroll-3 --loss ce --unroll 3
        budget eagle3-unroll-3 --head-type eagle3 --loss ce --unroll 3
        budget obj-ce --loss ce
        budget obj-accept --loss accept
        budget obj-topk --loss ce:1,topk:1                  # HASS's top-K term beside the CE
        budget unroll-5 --loss ce --unroll 5 ;;
    quality)
        # issue 12's draft-quality ablation: heads from scratch, BUDGET minutes of training each (CPU
        # time per thread, the lr decaying to 0 at the budget) on the same first N training prompts:
        # their answers by the target itself (data/regenerated/$M, as the long program trains on), by
        # ShareGPT's humans, or both; every answer cut at 192 tokens; bf16 target forwards for the
        # training features, fp32 for the held-out ones. Per head, in quality-BUDGETmin/: its config
        # (with the training-time evaluations on own answers), n-alpha on 50 held-out prompts' own
        # and human answers (eval-head, fp32), and MT-bench (10 questions, greedy) with the paper's
        # tree and with auto. Every step skips what is done; a run stopped midway resumes.
        BUDGET=${BUDGET:-30}
        N=1000
        OWN=data/regenerated/$M
        Q=$OUT/quality-${BUDGET}min
        A=(--model $M --aux-layers eagle3 --threads 2)
        $E extract "${A[@]}" --split heldout --data "$OWN-heldout" --limit 50 --dtype float32 --out "$F/q-own-heldout"
        $E extract "${A[@]}" --split train --data "$OWN" --limit $N --answer-tokens 192 --dtype bfloat16 --out "$F/q-own"
        mkdir -p "$Q"
        quality() {  # NAME FEATURES [train options]
            local name=$1 features=$2 run=$RUNS/quality-$1-${BUDGET}min
            shift 2
            local done=1 f  # a finished head's results stay, even where its run folder is gone
            for f in "" -own -human -mt-bench; do [[ -f "$Q/$name$f.json" ]] || done=0; done
            (( done )) && return
            $E train --model $M --train-features "$F/$features" --heldout-features "$F/q-own-heldout" --out "$run" \
                --epochs 1000 --budget-minutes "$BUDGET" "${RECIPE[@]}" "$@"  # a finished run returns at once
            cp "$run/head/config.json" "$Q/$name.json"
            for text in own human; do
                [[ -f "$Q/$name-$text.json" ]] && continue
                data=$([[ $text == own ]] && echo "$OWN-heldout" || echo sharegpt)
                $E eval-head --model $M --head "$run/head" --data "$data" --limit 50 --dtype float32 --threads 2 \
                    --json | tail -n 1 > "$Q/$name-$text.json.tmp" && mv "$Q/$name-$text.json.tmp" "$Q/$name-$text.json"
            done
            [[ -f "$Q/$name-mt-bench.json" ]] || $E bench --model $M --head "$run/head" --dataset mt-bench --limit 10 \
                --temperature 0 --max-new-tokens 128 --threads 2 --methods vanilla,eagle:eagle1,eagle:auto \
                --out "$Q/$name-mt-bench.json"
        }
        quality own-eagle1 q-own                              # feature:1,ce:0.1, one step (EAGLE-1)
        quality own-ce q-own --loss ce
        quality own-accept q-own --loss accept
        quality own-topk q-own --loss ce:1,topk:1
        quality own-unroll-3 q-own --loss ce --unroll 3
        quality own-unroll-5 q-own --loss ce --unroll 5
        quality own-eagle3-unroll-3 q-own --head-type eagle3 --loss ce --unroll 3
        # the human and mixed features are extracted only when their heads are due (a fresh machine's
        # session then spends its first minutes on the own-answer heads' features alone)
        $E extract "${A[@]}" --data sharegpt --split train --limit $N --answer-tokens 192 --dtype bfloat16 --out "$F/q-human"
        $E extract "${A[@]}" --split train --data "$OWN:1,sharegpt:1" --limit $((2 * N)) --answer-tokens 192 \
            --dtype bfloat16 --reuse "$F/q-human" --out "$F/q-mixed"  # the (longer) human half copied
        quality human-eagle1 q-human
        quality mixed-eagle1 q-mixed ;;
    *) echo "unknown ablation '$1': trees, heads, data, objectives or quality" >&2; exit 1 ;;
esac
