"""`onnxfuse export llama|dlrm|hf`: the exporters' parsers and handlers."""
from __future__ import annotations

import json
import pathlib

from ..genai import command as genai_command
from ._common import DEFAULT_OUT, _add_output_flags, _console, _names, _positive, _sizes


def _add_common_export(p):
    p.add_argument("-o", "--output", help="output .onnx path (default: models/<name>.onnx)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32", help="parameter dtype (default fp32)")
    p.add_argument("--seed", type=int, default=0, help="random seed for weights and inputs (default 0)")
    p.add_argument("--batch", type=_positive, help="batch size of the example inputs")
    p.add_argument("--dynamic", action="store_true", help="symbolic batch (and sequence) dimensions")
    p.add_argument("--exporter", choices=["auto", "dynamo", "torchscript"], default="auto",
                   help="torch.onnx exporter (auto: dynamo, falling back to TorchScript with a warning)")
    p.add_argument("--external-data", action="store_true", default=None,
                   help="store weights in '<output>.data' (automatic above 2 GB)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _add_output_flags(p, "print the result as JSON")


def _export_llama(args) -> int:
    from .. import zoo
    overrides = {k: getattr(args, k) for k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
        "max_position_embeddings", "rms_norm_eps", "rope_theta", "batch", "seq", "attn_implementation",
        "hidden_act") if getattr(args, k) is not None}
    overrides["num_hidden_layers"] = args.layers
    overrides["mlp_only"] = args.mlp_only
    overrides["mlp_bias"] = args.mlp_bias
    if args.lora_rank:
        overrides.update(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha or 0.0)
        if args.lora_targets:
            overrides["lora_targets"] = tuple(args.lora_targets)
    spec = zoo.LlamaSpec.from_preset(args.preset, **overrides)
    name = (f"llama-{args.preset}-{'mlp' if args.mlp_only else f'{args.layers}l'}"
            f"{f'-lora{args.lora_rank}' if args.lora_rank else ''}-{args.dtype}")
    return _run_export(args, "llama", spec, name)


def _export_dlrm(args) -> int:
    from .. import zoo
    overrides = {k: getattr(args, k) for k in ("bottom_mlp", "top_mlp", "embedding_dim", "table_cap", "interaction",
                                                 "batch", "num_dense") if getattr(args, k) is not None}
    if args.cardinalities:
        overrides["cardinalities"] = args.cardinalities
    if args.lora_rank:
        overrides.update(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha or 0.0)
    spec = zoo.DlrmSpec.from_preset(args.preset, **overrides)
    if args.layout != "onnxfuse":
        from ..errors import OnnxfuseError
        if args.lora_rank:
            raise OnnxfuseError(f"--layout {args.layout}: DLRM_Net has no LoRA branch; leave out --lora-rank")
        if args.exporter == "dynamo":
            raise OnnxfuseError(f"--layout {args.layout} is exported as the repository's --save-onnx does "
                                "(TorchScript, opset 11); leave out --exporter dynamo")
        kind = {"upstream": "dlrm-upstream", "upstream-tables": "dlrm-upstream-tables"}[args.layout]
        return _run_export(args, kind, spec, f"dlrm-{args.layout}-{args.preset}-{args.dtype}")
    name = f"dlrm-{args.preset}{f'-lora{args.lora_rank}' if args.lora_rank else ''}-{args.dtype}"
    return _run_export(args, "dlrm", spec, name)


def _run_export(args, kind, spec, name) -> int:
    from .. import export
    from .._term import Stages
    out = pathlib.Path(args.output) if args.output else DEFAULT_OUT / f"{name}.onnx"
    if not args.output:
        out.parent.mkdir(parents=True, exist_ok=True)
    res = export.export(kind, spec, out, seed=args.seed, dtype=args.dtype, exporter=args.exporter,
                        dynamic=args.dynamic, external_data=args.external_data, force=args.force,
                        progress=Stages("export", not (args.quiet or args.json)),
                        lora_as_inputs=getattr(args, "lora_as_inputs", False) or bool(getattr(args, "adapters", 0)),
                        multi_adapters=getattr(args, "adapters", 0) or 0)
    # res.warnings (e.g. the TorchScript fallback) were already issued as Python warnings, printed by main().
    if args.json:
        print(json.dumps({"path": str(res.path), "data_path": str(res.data_path) if res.data_path else None,
                          "exporter": res.exporter, "seconds": round(res.seconds, 2), "op_counts": res.op_counts,
                          "adapter_path": str(res.adapter_path) if res.adapter_path else None,
                          "recipe": res.recipe}, indent=2))
    elif not args.quiet:
        from .._term import human_size
        con = _console()
        data = f" and its weights {res.data_path} ({human_size(res.data_path.stat().st_size)})" if res.data_path else ""
        con.print(f"wrote {res.path}{data} ({res.exporter} exporter, {res.seconds:.1f} s, "
                  f"{sum(res.op_counts.values())} nodes)", soft_wrap=True)
        con.print("  " + ", ".join(f"{k} {v}" for k, v in res.op_counts.items()))
        if res.adapter_path:
            con.print(f"  adapter {res.adapter_path} (its A and B are the model's <layer>.lora_A/B inputs)",
                      soft_wrap=True)
    return 0


def register(sub, parser_class) -> None:
    ex = sub.add_parser("export", help="export a PyTorch model (llama, dlrm) to ONNX with a rebuild recipe, or a "
                        "checkpoint (hf) to an onnxruntime-genai folder")
    exsub = ex.add_subparsers(dest="model", metavar="MODEL", parser_class=parser_class, required=True)
    ll = exsub.add_parser("llama", help="a transformers Llama decoder (random weights, no downloads)")
    ll.add_argument("--preset", choices=["seed", "tiny", "llama2-7b"], default="seed",
                    help="base shapes: seed (the notebook's h1024/i11008, 4 heads, 2x1024 tokens), tiny (tests), "
                         "llama2-7b (h4096/i11008, 32 heads)")
    ll.add_argument("--layers", type=_positive, default=1, help="number of decoder layers (default 1)")
    ll.add_argument("--mlp-only", action="store_true", help="export one LlamaMLP alone (input x: batch x seq x hidden)")
    ll.add_argument("--seq", type=_positive, help="sequence length of the example inputs")
    for flag, typ in (("hidden-size", _positive), ("intermediate-size", _positive), ("num-attention-heads", _positive),
                      ("num-key-value-heads", _positive), ("vocab-size", _positive),
                      ("max-position-embeddings", _positive), ("rms-norm-eps", float), ("rope-theta", float)):
        ll.add_argument(f"--{flag}", type=typ, help="LlamaConfig field (default from --preset)")
    ll.add_argument("--attn-implementation", choices=["eager", "sdpa"], help="attention implementation (default eager)")
    ll.add_argument("--hidden-act", help="MLP activation (default silu)")
    ll.add_argument("--mlp-bias", action="store_true", help="bias on the MLP projections")
    ll.add_argument("--lora-rank", type=int, default=0, help="wrap linears with peft LoRA adapters of this rank")
    ll.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 2 x rank)")
    ll.add_argument("--lora-targets", type=_names, metavar="M1,M2",
                    help="comma-separated modules to adapt (default gate_proj,up_proj,down_proj)")
    ll.add_argument("--lora-as-inputs", action="store_true",
                    help="the adapters' A and B as graph inputs (zero defaults: the base model) and the adapter in "
                         "<output>_adapter (onnxruntime's adapter format): one model for any adapter of these shapes")
    ll.add_argument("--adapters", type=_positive, metavar="N",
                    help="a batch that mixes up to N adapters: each LoRA layer a MultiLoRALinear over stacked A/B "
                         "inputs [N, ...] and <layer>.lora_scales [N], with an adapter_index input (one per batch "
                         "row, -1 for none); implies --lora-as-inputs")
    _add_common_export(ll)
    ll.set_defaults(func=_export_llama)

    dl = exsub.add_parser("dlrm", help="a DLRM recommender (13 dense + 26 sparse Criteo-style features)")
    dl.add_argument("--preset", choices=["criteo-kaggle", "small"], default="criteo-kaggle",
                    help="criteo-kaggle: Kaggle cardinalities capped by --table-cap; small: tables capped at 1000")
    dl.add_argument("--bottom-mlp", type=_sizes, metavar="N1,N2", help="bottom MLP sizes (default 512,256,64,16)")
    dl.add_argument("--top-mlp", type=_sizes, metavar="N1,N2", help="top MLP sizes (default 512,256,1)")
    dl.add_argument("--embedding-dim", type=_positive, help="embedding dimension (default 16)")
    dl.add_argument("--cardinalities", type=_sizes, metavar="N1,N2", help="table sizes, 26 values like 1460,583,...")
    dl.add_argument("--table-cap", type=_positive, help="cap on each table's rows (default 262144)")
    dl.add_argument("--num-dense", type=_positive, help="number of dense features (default 13)")
    dl.add_argument("--interaction", choices=["dot", "cat"], help="feature interaction (default dot)")
    dl.add_argument("--layout", choices=["onnxfuse", "upstream", "upstream-tables"], default="onnxfuse",
                    help="onnxfuse's DLRM (one hashed id per feature), or facebookresearch/dlrm's DLRM_Net as its "
                         "--save-onnx writes it (TorchScript at opset 11, its dynamic axes, nn.EmbeddingBag bags of "
                         "0-3 ids): stacked offsets/indices (upstream) or one offsets_i/indices_i pair per table "
                         "(upstream-tables, the tables' lookups of their own lengths); fuse upgrades the opset")
    dl.add_argument("--lora-rank", type=int, default=0, help="add a plain-PyTorch LoRA branch to every MLP layer")
    dl.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 2 x rank)")
    _add_common_export(dl)
    dl.set_defaults(func=_export_dlrm)
    genai_command.register_export(exsub)
