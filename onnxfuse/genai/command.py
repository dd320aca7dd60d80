"""The command line of genai folders: `export hf`, `generate`, and what `fuse`, `verify` and `view` do when given a
folder. Each function parses nothing itself: the cli package's parsers call them with their args."""
from __future__ import annotations

import json
import pathlib
import sys

from ..argtypes import option_key, option_list, positive_int
from ..errors import OnnxfuseError
from ..host import FAMILIES


def register_export(exsub) -> None:
    """`export hf` under the cli package's `export` subparsers."""
    hf = exsub.add_parser("hf", help="a transformers CausalLM checkpoint (folder, .gguf or hub id) -> an "
                                     "onnxruntime-genai model folder, fused",
                          description="Build an onnxruntime-genai model folder from a checkpoint with genai's model "
                                      "builder, then fuse its decoder (default): the folder's model.onnx is the "
                                      "fused one and genai_config.json names the kernel library beside it. Run it "
                                      "with 'onnxfuse generate DIR', check it with 'onnxfuse verify DIR'.")
    hf.add_argument("source", metavar="SOURCE",
                    help="a transformers checkpoint folder (config.json + safetensors), a .gguf file (dequantized "
                         "by transformers' GGUF loader), or a hub id where the hub is reachable")
    hf.add_argument("-o", "--output", metavar="DIR", help="the model folder (default models/<name>-<dtype>-<provider>)")
    hf.add_argument("--dtype", choices=["fp32", "fp16", "bf16", "int4"], default="fp32",
                    help="the builder's precision (default fp32)")
    hf.add_argument("--provider", choices=["cpu", "cuda"], default="cpu",
                    help="the execution provider the folder is built and fused for (default cpu)")
    hf.add_argument("--no-fuse", dest="fuse", action="store_false",
                    help="write the builder's folder as it is (fuse it later with 'onnxfuse fuse DIR')")
    hf.add_argument("--cpu-isa", choices=[name for name, _ in FAMILIES],
                    help="with --provider cpu: the host family the folder will run on (default this host's): "
                         "patterns measured slower there than onnxruntime's own are left to it")
    hf.add_argument("--block-size", type=int, choices=[16, 32, 64, 128, 256],
                    help="with --dtype int4: the quantization block along K (the builder's block_size; its default "
                         "32); 'onnxfuse verify DIR' then reports the perplexity against fp32. On an H100/H200, "
                         "blocks of 64 or more let prompts and batches of 128+ rows run CUTLASS's int4 GEMM "
                         "(README, Kernels)")
    hf.add_argument("--extra-options", type=option_list, metavar="K=V,K2=V2", default=[],
                    help="passed to the builder's --extra_options (e.g. prune_lm_head=true); with --dtype int4 "
                         "--provider cuda, accuracy_level=4 unless one is given (the one-row decode GEMV rounds X "
                         "to int8; accuracy_level=0 keeps it fp16)")
    hf.add_argument("--trust-remote-code", action="store_true",
                    help="let transformers run the checkpoint's own Python code (off by default: a checkpoint is "
                         "untrusted input)")
    hf.add_argument("--allow-pickle", action="store_true",
                    help="accept a folder whose weights are only pickles (.bin), which can run code when loaded")
    hf.add_argument("--adapter", action="append", metavar="[NAME=]PEFT_DIR",
                    help="a peft LoRA adapter folder (repeat for more, of the same target modules and rank): the "
                         "decoder takes the LoRA weights as inputs (zero defaults: the base model) and each adapter "
                         "is written to NAME.onnx_adapter in the folder (NAME default: the folder's name), for "
                         "'generate --adapter NAME', genai's Adapters or onnxruntime's LoraAdapter")
    hf.add_argument("--force", action="store_true", help="replace an existing output folder")
    hf.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    hf.add_argument("--json", action="store_true", help="print the result as JSON")
    hf.set_defaults(func=export_command)


def register(sub) -> None:
    """`generate`, a command of its own."""
    g = sub.add_parser("generate", help="generate text with an onnxruntime-genai model folder (fused or not)",
                       description="Tokenize with transformers (the chat template with --chat), run genai's "
                                   "Generator, stream the text as it comes, stop at EOS; prefill ms and decode "
                                   "tokens/s go to stderr at the end.")
    g.add_argument("folder", metavar="DIR", help="a genai model folder ('onnxfuse export hf' or the builder made it)")
    g.add_argument("--prompt", required=True, help="the prompt text")
    g.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the tokenizer's chat template as a user turn")
    g.add_argument("--max-new-tokens", type=positive_int, default=128, help="new tokens at most (default 128)")
    g.add_argument("--greedy", action="store_true", help="pick the most likely token (the default unless "
                   "--temperature/--top-p/--top-k/--seed is given)")
    g.add_argument("--temperature", type=float, help="sample with this temperature")
    g.add_argument("--top-p", type=float, help="sample from the nucleus of this probability")
    g.add_argument("--top-k", type=positive_int, help="sample from the k most likely tokens")
    g.add_argument("--seed", type=int, help="random seed of the sampling")
    g.add_argument("--provider", choices=["cpu", "cuda"], help="execution provider (default: the folder's)")
    g.add_argument("--adapter", metavar="NAME", help="activate the folder's LoRA adapter NAME.onnx_adapter "
                   "('export hf --adapter' wrote it; default: the base model)")
    g.add_argument("--cuda-graph", action="store_true", help="with --provider cuda: genai runs each decode step as "
                   "a captured CUDA graph")
    g.add_argument("-q", "--quiet", action="store_true", help="print only the generated text")
    g.add_argument("--json", action="store_true", help="print ids, text and timings as JSON instead of streaming")
    g.set_defaults(func=generate_command)


def add_verify_args(ve) -> None:
    """What `verify` takes for a folder."""
    ve.add_argument("--source", metavar="CHECKPOINT",
                    help="for a genai folder: the transformers folder or .gguf it was built from (default: the "
                         "folder's onnxfuse.json)")
    ve.add_argument("--prompt", help="for a genai folder: the prompt of the logits and text checks (default "
                                     "'The capital of France is')")
    ve.add_argument("--cuda-graph", action="store_true", help="for a genai folder on --provider cuda: genai runs "
                    "the decode steps as captured CUDA graphs")


# ------------------------------------------------------------------------------------------------ commands
def _no_progress_bars() -> None:
    """transformers' GGUF loader draws a tqdm bar of its own; tqdm reads TQDM_DISABLE when first imported."""
    import os
    os.environ.setdefault("TQDM_DISABLE", "1")


def export_command(args) -> int:
    _no_progress_bars()
    from . import export_hf
    from .._term import Stages
    stages = Stages("export hf", not (args.quiet or args.json))
    extra = list(args.extra_options)
    if args.block_size is not None:
        if args.dtype != "int4":
            raise OnnxfuseError("--block-size quantizes int4 weights: add --dtype int4")
        if any(option_key(o) in ("block_size", "int4_block_size") for o in extra):
            raise OnnxfuseError("--block-size and --extra-options block_size=... both given; keep one")
        extra.append(f"block_size={args.block_size}")
    res = export_hf(args.source, args.output, precision=args.dtype, provider=args.provider, fuse=args.fuse,
                    force=args.force, extra_options=extra, trust_remote_code=args.trust_remote_code,
                    allow_pickle=args.allow_pickle, cpu_isa=args.cpu_isa, adapters=args.adapter, progress=stages)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    elif not args.quiet:
        fused = ", ".join(f"{op} x{n}" for op, n in res.fused.items()) or "nothing fused"
        print(f"wrote {res.folder} (builder {res.builder_seconds:.1f} s"
              f"{f', fuse {res.fuse_seconds:.1f} s' if res.fuse_seconds is not None else ''}): {fused}")
        for pattern, why in res.left_to_onnxruntime.items():
            print(f"  {pattern}: left to onnxruntime: {why}")
        for name, path in res.adapters.items():
            print(f"  adapter {name}: {path} (onnxfuse generate {res.folder} --adapter {name} ...)")
        print(f"  run it: onnxfuse generate {res.folder} --prompt '...'  check it: onnxfuse verify {res.folder}")
    return 0


def generate_command(args) -> int:
    from . import generate
    from .generate import Sampling
    sampled = any(v is not None for v in (args.temperature, args.top_p, args.top_k, args.seed))
    if args.greedy and sampled:
        raise OnnxfuseError("--greedy does not go with --temperature/--top-p/--top-k/--seed; choose one")
    sampling = Sampling(greedy=not sampled, temperature=args.temperature if args.temperature is not None else 1.0,
                        top_p=args.top_p if args.top_p is not None else 1.0,
                        top_k=args.top_k if args.top_k is not None else 50, seed=args.seed)

    def stream(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    res = generate(pathlib.Path(args.folder), args.prompt, chat=args.chat, max_new_tokens=args.max_new_tokens,
                   sampling=sampling, provider=args.provider, cuda_graph=args.cuda_graph,
                   on_text=None if args.json else stream, adapter=args.adapter)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
        return 0
    print()
    if not args.quiet:
        rate = f"{res.decode_tokens_per_s:.1f} tokens/s" if res.decode_tokens_per_s else "n/a"
        print(f"[{len(res.prompt_ids)} prompt tokens, prefill {res.prefill_ms:.1f} ms; {len(res.new_ids)} new tokens, "
              f"decode {rate}{', stopped at EOS' if res.stopped_at_eos else ''}]", file=sys.stderr)
    return 0


def fuse_command(args) -> int:
    """`fuse DIR`: a new fused folder."""
    from . import fuse_dir
    if args.backend or args.external_data or args.no_ort_fusions or args.write_unchanged:
        raise OnnxfuseError("fuse DIR (a genai folder) takes -o, --provider, --cpu-isa, --patterns, --explain, "
                            "--report, --force, -q and --json; fuse the folder's model.onnx itself for the other "
                            "options")
    out, res = fuse_dir(args.model, args.output, provider=args.provider, cpu_isa=args.cpu_isa,
                        patterns=args.patterns, force=args.force, explain=args.explain, report_path=args.report)
    if args.json:
        print(json.dumps({"folder": str(out), **res.report()}, indent=2))
    elif not args.quiet:
        # the fused decoder's own counts: a match a later rule took in (Int4Linear into SkipRMSNormInt4Linear) is gone
        from . import folder as gf
        counts = gf.op_counts(gf.decoder_path(out))
        fused = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()) if op.startswith("onnxfuse::"))
        print(f"wrote {out}: {fused or 'nothing fused'}")
        for pattern, why in res.left_to_ort.items():
            print(f"  {pattern}: left to onnxruntime: {why}")
        if args.explain:
            print("\n".join(res.explain_lines()))
    return 0


def verify_command(args) -> int:
    _no_progress_bars()
    import tempfile
    from . import folder as gf
    from .check import DEFAULT_PROMPT, source_of, verify_folder
    from .._term import checks_table, console
    folder = pathlib.Path(args.model)
    if args.module or args.backend or args.no_graph_opt or args.require_library:
        raise OnnxfuseError("verify DIR (a genai folder) takes --source, --prompt, --provider, --tolerance, -q and "
                            "--json")
    gf.read_config(folder)
    with tempfile.TemporaryDirectory() as work:
        source = source_of(folder, gf.read_recipe(folder), args.source, pathlib.Path(work))
        res = verify_folder(folder, source=source, provider=args.provider if args.provider != "cpu" else None,
                            prompt=args.prompt or DEFAULT_PROMPT, tolerance=args.tolerance,
                            cuda_graph=args.cuda_graph)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    elif not args.quiet:
        con = console()
        graph = ", genai's CUDA graph" if res.cuda_graph else ""
        con.print(checks_table(f"verify {folder} ({res.provider}{graph}, {res.dtype}, {res.fused_nodes} onnxfuse "
                               "nodes)", res.outputs))
        tk = res.tokens
        if tk.first_divergence is None:
            con.print(f"greedy text: {len(tk.onnx)} tokens, token for token equal to transformers' generate")
        else:
            con.print(f"greedy text: first divergence at new token {tk.first_divergence} (genai "
                      f"{tk.onnx[tk.first_divergence:tk.first_divergence + 3]}, transformers "
                      f"{tk.reference[tk.first_divergence:tk.first_divergence + 3]})"
                      f"{': FAIL (fp32 must be exact)' if tk.exact_required else ' (allowed in ' + res.dtype + ')'}")
        if res.perplexity is not None:
            p = res.perplexity
            con.print(f"perplexity on {p.text} ({p.tokens} tokens): {p.onnx:.3f} against the fp32 reference's "
                      f"{p.reference:.3f} ({p.ratio:.3f}x; {'PASS' if p.passed else 'FAIL'}: at most {p.max_ratio}x)"
                      + ("; the int4 logits and tokens above are reported, the perplexity decides"
                         if res.quantized else ""))
    return 0 if res.passed else 1
