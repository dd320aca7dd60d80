"""`python -m onnxfuse.bench [bench args]` or `python -m onnxfuse.bench plot RESULTS.json [-o PNG]`."""
import sys

from .command import main

sys.exit(main())
