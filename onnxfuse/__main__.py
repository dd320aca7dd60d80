"""`python -m onnxfuse ...`: the same as the `onnxfuse` command (cli.main)."""
import sys

from .cli import main

sys.exit(main())
