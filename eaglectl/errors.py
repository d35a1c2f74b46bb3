"""User-facing failures, each with a stable exit code and a kebab-case reference.

    EaglectlError                      (base, never raised directly)
    ├── CheckpointNotFoundError    3   path, Hub repo, revision or file missing / not cached
    ├── CorruptCheckpointError     4   header, offsets, dtype, shard index or config unreadable
    ├── UnknownFormatError         5   no dialect fits
    ├── AmbiguousFormatError       6   two dialects fit equally; pass --from
    ├── ConversionError            7   a conversion cannot be done faithfully
    ├── ParityMismatchError        8   outputs exceed tolerance
    ├── SmokeFailedError           9   vLLM failed or acceptance red flags
    ├── MissingDependencyError    10   vLLM interpreter, CUDA or an extra is unavailable
    ├── PickleNotAllowedError     11   a pickle (.bin) input without --allow-pickle
    ├── OutputExistsError         12   destination exists and --force was not given
    └── IncompatibleDrafterError  13   the reference drafter cannot run this checkpoint

Exit code 1 means "findings at error level" (or warnings under --strict), 2 is Click's usage
error, 70 (EX_SOFTWARE) is a bug in eaglectl. Library code raises only these types; messages are
one line and name the file, tensor or key.
"""

from __future__ import annotations

from typing import Any, ClassVar

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70


class EaglectlError(Exception):
    exit_code: ClassVar[int] = 1
    reference: ClassVar[str] = "error"
    summary: ClassVar[str] = ""

    def __init__(self, message: str, *, hint: str | None = None, reported: bool = False, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.reported = reported  # the command already printed its report (JSON or table)
        self.context = {k: v for k, v in context.items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "message": self.message,
            "context": {k: str(v) for k, v in self.context.items()},
            "hint": self.hint,
            "exit_code": self.exit_code,
        }


class CheckpointNotFoundError(EaglectlError):
    exit_code = 3
    reference = "checkpoint-not-found"
    summary = "A path, Hub repo, revision or file is missing (or not in the cache when offline)."


class CorruptCheckpointError(EaglectlError):
    exit_code = 4
    reference = "corrupt-checkpoint"
    summary = "A safetensors header, shard index or config cannot be parsed or fails validation."


class UnknownFormatError(EaglectlError):
    exit_code = 5
    reference = "unknown-format"
    summary = "No registered dialect matches the checkpoint."


class AmbiguousFormatError(EaglectlError):
    exit_code = 6
    reference = "ambiguous-format"
    summary = "Two or more dialects match equally well; pass --from."


class ConversionError(EaglectlError):
    exit_code = 7
    reference = "conversion-failed"
    summary = "A tensor or config field cannot be mapped faithfully."


class ParityMismatchError(EaglectlError):
    exit_code = 8
    reference = "parity-mismatch"
    summary = "Numerical outputs exceed the stated tolerance (the report is printed first)."


class SmokeFailedError(EaglectlError):
    exit_code = 9
    reference = "smoke-failed"
    summary = "vLLM crashed or timed out, or acceptance shows a red flag."


class MissingDependencyError(EaglectlError):
    exit_code = 10
    reference = "missing-dependency"
    summary = "A vLLM interpreter, CUDA device or optional package is unavailable."


class PickleNotAllowedError(EaglectlError):
    exit_code = 11
    reference = "pickle-not-allowed"
    summary = "A pickle checkpoint (.bin) was given without --allow-pickle."


class OutputExistsError(EaglectlError):
    exit_code = 12
    reference = "output-exists"
    summary = "The destination exists; pass --force to replace it."


class IncompatibleDrafterError(EaglectlError):
    exit_code = 13
    reference = "incompatible-drafter"
    summary = "The reference drafter cannot run this checkpoint (architecture, missing or extra tensor)."


ERROR_TYPES: tuple[type[EaglectlError], ...] = (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnknownFormatError,
    AmbiguousFormatError,
    ConversionError,
    ParityMismatchError,
    SmokeFailedError,
    MissingDependencyError,
    PickleNotAllowedError,
    OutputExistsError,
    IncompatibleDrafterError,
)
