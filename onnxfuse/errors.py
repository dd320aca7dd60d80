"""Errors users see: one line that names the fix, and the exit code the CLI returns for it."""


class OnnxfuseError(Exception):
    """A failure caused by the user's input or environment (exit code 2 by default)."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class VerificationFailed(OnnxfuseError):
    """The model's outputs differ from the reference beyond tolerance (exit code 1)."""

    exit_code = 1
