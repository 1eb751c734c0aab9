"""Every error Tessera raises on purpose, in one family so callers can catch it whole.

::

    TesseraError                      anything Tessera refuses or cannot do
    ├── InvalidInputError             bad input; names the field, the problem and the fix
    │   ├── UnknownModelError         a GPU model the catalogue does not have
    │   ├── UnknownProfileError       a MIG profile the model does not have
    │   └── InvalidLayoutError        placements that are not allowed, overlap or exceed counts
    ├── StateFileError                a simulator state file that is missing or malformed
    └── BackendError                  the GPU backend (NVML) failed an operation
"""

from __future__ import annotations

from collections.abc import Iterable


class TesseraError(Exception):
    """Base of every error Tessera raises deliberately."""


class InvalidInputError(TesseraError, ValueError):
    """Input that Tessera refuses before it reaches any GPU or API.

    The message always names the offending field, what is wrong with it, and, where there is a
    closed set of valid values, what they are.
    """

    def __init__(self, field: str, problem: str, choices: Iterable[str] | None = None) -> None:
        self.field = field
        self.problem = problem
        self.choices = tuple(choices) if choices is not None else ()
        message = f"{field}: {problem}"
        if self.choices:
            message += f" (valid: {', '.join(self.choices)})"
        super().__init__(message)


class UnknownModelError(InvalidInputError):
    """A GPU model name, product name or PCI id that the catalogue does not know."""


class UnknownProfileError(InvalidInputError):
    """A MIG profile that the given GPU model does not offer."""


class InvalidLayoutError(InvalidInputError):
    """A set of placed slices that the GPU cannot hold."""


class StateFileError(TesseraError):
    """A node-state file (NVML simulator) that cannot be used; the file is left untouched."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        super().__init__(f"{path}: {field}: {problem}")


class BackendError(TesseraError):
    """A GPU backend operation that failed; carries the NVML return code when there is one."""

    def __init__(self, operation: str, message: str, code: int | None = None) -> None:
        self.operation = operation
        self.code = code
        super().__init__(f"{operation}: {message}")
