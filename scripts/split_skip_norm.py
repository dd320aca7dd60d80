"""A/B of LinearSkipRMSNorm in a fused onnxruntime-genai folder: writes a copy of FOLDER whose decoder has each
LinearSkipRMSNorm node split back into a Linear node and onnxruntime's com.microsoft SkipSimplifiedLayerNormalization
(the op's function body with the product fused as Linear), so that `onnxfuse bench genai` times the same model with
and without the op in one run (scripts/gpu_ort_session.sh generate, AB_SPLIT=1).

    python scripts/split_skip_norm.py FOLDER OUT

OUT's files are hard links to FOLDER's (the weights are not copied), but for the decoder, written anew.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys

import onnx
from onnx import helper

from onnxfuse.genai import folder as genai_folder
from onnxfuse.ops.linear import LINEAR, LINEAR_SKIP_RMS_NORM
from onnxfuse.schema import DOMAIN


def split(model: onnx.ModelProto) -> int:
    nodes, count = [], 0
    for node in model.graph.node:
        if node.domain != DOMAIN or node.op_type != LINEAR_SKIP_RMS_NORM.name:
            nodes.append(node)
            continue
        count += 1
        x, w, skip, gamma = node.input
        y, total = node.output
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        product = f"{node.name}/product"
        nodes.append(helper.make_node(LINEAR.name, [x, w], [product], name=f"{node.name}/linear", domain=DOMAIN,
                                      backend=attrs.get("backend", b"auto").decode()))
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [skip, product, gamma], [y, "", "", total],
                                      name=f"{node.name}/norm", domain="com.microsoft",
                                      epsilon=float(attrs.get("epsilon", 1e-5))))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def main(src: str, out: str) -> None:
    src_dir, out_dir = pathlib.Path(src), pathlib.Path(out)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(src_dir, out_dir, copy_function=os.link)
    decoder = genai_folder.decoder_path(out_dir)
    model = onnx.load(str(decoder), load_external_data=False)
    count = split(model)
    tmp = decoder.with_name(decoder.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, decoder)  # a new file: the hard link to FOLDER's decoder is left as it was
    print(f"wrote {out_dir}: {count} {LINEAR_SKIP_RMS_NORM.name} split into {LINEAR.name} + "
          "SkipSimplifiedLayerNormalization")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
