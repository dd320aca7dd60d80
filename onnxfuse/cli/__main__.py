"""`python -m onnxfuse.cli`: the same command line as `onnxfuse` and `python -m onnxfuse`."""
import sys

from . import main

sys.exit(main())
