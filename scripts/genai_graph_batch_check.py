"""A batch of sequences through genai's CUDA-graph mode against the same folder without it (issues 27 and 28).

genai 0.18's CUDA-graph mode feeds a prompt with past context (its static mask's length); onnxruntime's
GroupQueryAttention refuses a batch of such prompts, and a folder whose attention is onnxfuse's CachedAttention runs
them (on the CUDA EP by handing onnxruntime's kernel a sequence a call). This script says, for each folder: whether the
graph mode takes a batch of BATCH prompts of PROMPT random tokens (the ids `bench genai` uses), and where it does,
whether its greedy tokens (NEW of them a sequence) equal those of the same folder without the graph, and the largest
logit difference of the prefill's last position and of the first steps, over the largest logit.

    python scripts/genai_graph_batch_check.py FOLDER [FOLDER ...] [--batch 8] [--prompt 128] [--new 32]
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from onnxfuse.genai import folder as gf  # noqa: E402
from onnxfuse.genai.generate import kv_length, load_model  # noqa: E402
from onnxfuse.genai.timing import _prompt, refusal  # noqa: E402


def run(folder: pathlib.Path, cuda_graph: bool, batch: int, prompt: int, new: int):
    """(tokens [batch, new], logits of the prefill's last position and of the first 4 steps) or the refusal."""
    og, model = load_model(folder, "cuda", cuda_graph)
    config = gf.read_config(folder)
    ids = _prompt(int(config["model"]["vocab_size"]), batch, prompt, 0)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=kv_length(config, prompt + new), do_sample=False,
                              min_length=prompt + new, batch_size=batch)
    gen = og.Generator(model, params)
    try:
        gen.append_tokens(ids)
    except Exception as e:  # genai and onnxruntime raise plain RuntimeErrors
        return refusal(e)
    logits = [np.array(gen.get_logits()).reshape(batch, -1).astype(np.float32)]
    tokens = []
    for step in range(new):
        gen.generate_next_token()
        tokens.append(np.array(gen.get_next_tokens()).reshape(batch))
        if step < 4 and step + 1 < new:
            logits.append(np.array(gen.get_logits()).reshape(batch, -1).astype(np.float32))
    return np.stack(tokens, 1), logits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=pathlib.Path)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    a = ap.parse_args()
    bad = 0
    for folder in a.folders:
        plain = run(folder, False, a.batch, a.prompt, a.new)
        graph = run(folder, True, a.batch, a.prompt, a.new)
        if isinstance(plain, str):
            print(f"{folder}: without the graph refused: {plain}")
            bad += 1
            continue
        if isinstance(graph, str):
            print(f"{folder}: CUDA graph, batch {a.batch}, prompt {a.prompt}: refused ({graph})")
            continue
        same = (plain[0] == graph[0]).all(axis=1)
        first = [int(np.argmin(p == g)) if not s else None for p, g, s in zip(plain[0], graph[0], same)]
        # logits of the sequences whose tokens so far are the same (a sequence that parted has another context)
        errs = []
        for step, (p, g) in enumerate(zip(plain[1], graph[1])):
            alike = (plain[0][:, :step] == graph[0][:, :step]).all(axis=1)
            errs.append(float(np.abs(p[alike] - g[alike]).max() / max(np.abs(p[alike]).max(), 1e-30))
                        if alike.any() else float("nan"))
        print(f"{folder}: CUDA graph, batch {a.batch}, prompt {a.prompt}: {int(same.sum())} of {a.batch} sequences "
              f"token for token over {a.new} tokens (first divergence by sequence: {first}); logits max |d| / max "
              f"|ref| at the prefill's last position and the next steps (the sequences alike so far): "
              f"{', '.join(f'{e:.1e}' for e in errs)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
