"""`python -m onnxfuse.bench ARGS` is `onnxfuse bench ARGS`, parsed and dispatched by onnxfuse.cli (the bench
package has no parser of its own); `python -m onnxfuse.bench plot RESULTS.json [-o PNG]` only plots a results file."""
import sys

from ..cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
