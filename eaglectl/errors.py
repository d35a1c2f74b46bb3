"""User-facing failures, each with a stable exit code and a kebab-case reference (its class line), and its
summary (its docstring): docs/errors.md lists them.

Exit code 1 means "findings at error level" (or warnings under --strict), 2 is Click's usage
error, 130 an interrupt (Ctrl-C), 143 SIGTERM, 70 (EX_SOFTWARE) a bug in eaglectl. Library code
raises only these types; messages are one line and name the file, tensor or key.
"""

from __future__ import annotations

import errno
import shlex
from typing import Any, ClassVar

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class EaglectlError(Exception):
    """The base, never raised directly. Each subclass names its exit code and reference in its class line; its
    docstring is its summary (its line in docs/errors.md)."""

    exit_code: ClassVar[int] = 1
    reference: ClassVar[str] = "error"
    summary: ClassVar[str] = ""

    def __init_subclass__(cls, *, exit_code: int | None = None, reference: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.exit_code = cls.exit_code if exit_code is None else exit_code
        cls.reference = cls.reference if reference is None else reference
        if "summary" not in cls.__dict__:
            cls.summary = " ".join((cls.__doc__ or "").split())

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


# bad arguments found by the library (a manifest line, an option value): Click's own usage exit code
class UsageError(EaglectlError, exit_code=2, reference="usage"):
    """Bad flags, arguments or manifest lines."""


class CheckpointNotFoundError(EaglectlError, exit_code=3, reference="checkpoint-not-found"):
    """A path, Hub repo, revision or file is missing (or not in the cache when offline)."""


class CorruptCheckpointError(EaglectlError, exit_code=4, reference="corrupt-checkpoint"):
    """A safetensors header, shard index or config cannot be parsed or fails validation."""


class UnknownFormatError(EaglectlError, exit_code=5, reference="unknown-format"):
    """No registered dialect matches the checkpoint."""


class AmbiguousFormatError(EaglectlError, exit_code=6, reference="ambiguous-format"):
    """Two or more dialects match equally well; pass --from."""


class ConversionError(EaglectlError, exit_code=7, reference="conversion-failed"):
    """A tensor or config field cannot be mapped faithfully; nothing was written."""


class ParityMismatchError(EaglectlError, exit_code=8, reference="parity-mismatch"):
    """Numerical outputs exceed the stated tolerance (the report is printed first)."""


class SmokeFailedError(EaglectlError, exit_code=9, reference="smoke-failed"):
    """vLLM crashed or timed out, or acceptance shows a red flag."""


class MissingDependencyError(EaglectlError, exit_code=10, reference="missing-dependency"):
    """This machine lacks what a requested step needs: a vLLM interpreter, a CUDA device, an optional package, a Hub
    token or connection (`check` with a smoke stage that cannot run here; `upload`)."""


class PickleNotAllowedError(EaglectlError, exit_code=11, reference="pickle-not-allowed"):
    """A pickle checkpoint (.bin) was given without --allow-pickle."""


class OutputExistsError(EaglectlError, exit_code=12, reference="output-exists"):
    """The destination exists; --force replaces only a folder holding nothing but checkpoint files, never a file, link
    or device."""


class IncompatibleDrafterError(EaglectlError, exit_code=13, reference="incompatible-drafter"):
    """The reference drafter cannot run this checkpoint (architecture, missing or extra tensor)."""


class ReferenceLimitError(IncompatibleDrafterError):
    """The checkpoint uses a feature eaglectl's reference drafter does not implement (a RoPE type, a quantised
    layout): a limit of eaglectl, not a fault of the drafter. `check` calls such a stage undecided (exit 10)."""

    SERVED = ("a limit of eaglectl's reference drafter: vLLM serves it, so measure it with "
              "eaglectl smoke {source} --target {target} --engine vllm")

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        super().__init__(message, hint=hint or self.SERVED.format(source="SOURCE", target="TARGET"), **context)

    def measure_with(self, source: str, target: str | None) -> None:
        """The default hint, with the drafter and target of the run that raised it (a command that runs as printed)."""
        if self.hint == self.SERVED.format(source="SOURCE", target="TARGET"):
            self.hint = self.SERVED.format(source=shlex.quote(source),
                                           target=shlex.quote(target) if target else "TARGET")


class OutputBusyError(EaglectlError, exit_code=14, reference="output-busy"):
    """Another eaglectl run holds the lock on this destination; nothing was written."""


class FilesystemError(EaglectlError, exit_code=15, reference="filesystem-error"):
    """A read or write was refused by the operating system (permissions, missing folder, name too long)."""


class SourceChangedError(EaglectlError, exit_code=16, reference="source-changed"):
    """A source file changed (size, mtime, inode) while it was read; the output was discarded."""


class BehaviourChangedError(EaglectlError, exit_code=17, reference="behaviour-changed"):
    """The written drafter drafts differently from its source under the reference loop; discarded."""


class CaptureFailedError(EaglectlError, exit_code=18, reference="capture-failed"):
    """The engine capturing target hidden states crashed, timed out or wrote no dumps (log named)."""


class InvalidStatesError(EaglectlError, exit_code=19, reference="invalid-states"):
    """A capture folder (--states) or the target states computed for calibration are malformed, out of range,
    inconsistent or non-finite, or too few / too degenerate to use; nothing was written."""


class PromptFileError(EaglectlError, exit_code=20, reference="prompt-file"):
    """A --prompts value is missing or bad: a JSONL line that is not a prompt object, wrong types, token ids outside
    the target's vocabulary, invalid UTF-8, over a size limit, or a SPEED-Bench folder with the wrong schema."""


class ManifestError(EaglectlError, exit_code=21, reference="manifest"):
    """A batch manifest (--manifest) line is not a valid item: bad JSON, wrong types, an unknown key or value."""


class ServerReplyError(EaglectlError, exit_code=22, reference="server-reply"):
    """A running server (smoke --server, capture --engine server) refused, timed out, redirected to another host,
    replied non-JSON, oversized, malformed or 5xx, or its /metrics counters went backwards."""


class OutputOverlapError(EaglectlError, exit_code=23, reference="output-overlaps-input"):
    """An output (DEST, --out, --profile, --sarif, --plot, a model card) would be, hold, lie inside or hard-link an
    input of the same command; nothing was written, no input touched."""


def first_line(e: BaseException, most: int | None = None) -> str:
    """An exception's message as one line (at most `most` characters), or its type's name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0][:most] if text else type(e).__name__


# What to do about a refused read or write, by errno name: the system's reason alone names no next step.
FILESYSTEM_HINTS = {
    "EACCES": "this user may not write or read there: choose a folder you own (DEST, --out) or fix its permissions",
    "EPERM": "this user may not write or read there: choose a folder you own (DEST, --out) or fix its permissions",
    "EROFS": "the file system is read-only (a mounted snapshot, a container's image layer): choose a writable folder",
    "ENOSPC": "the disk is full: free space, or write to a folder on another disk",
    "EDQUOT": "the disk quota is used up: free space, or write to a folder on another disk",
    "ENAMETOOLONG": "shorten the path (or a folder name in it)",
    "ENOENT": "a folder on the way does not exist: create it, or check the spelling",
}
# A safetensors file shorter than its own header says: the usual cause is a copy or download cut short.
TRUNCATED_HINT = ("the file is shorter than its header says (a download or copy cut short): fetch or copy it again, "
                  "and compare its size with the source's")


def filesystem_error(e: OSError, doing: str, path: object | None = None) -> FilesystemError:
    """One line for an OSError: what was attempted, on which path, and the system's reason, with what to do about
    it where the reason names a next step (FILESYSTEM_HINTS). A `doing` that ends in a preposition ("create a
    staging folder in") is about the path: "PATH: cannot create a staging folder in it (Read-only file system)"."""

    where = path if path is not None else (e.filename or "?")
    reason = e.strerror or str(e) or type(e).__name__
    if doing.rsplit(" ", 1)[-1] in ("in", "into", "to", "from", "at", "under"):
        doing += " it"
    hint = FILESYSTEM_HINTS.get(errno.errorcode.get(e.errno or 0, ""))
    return FilesystemError(f"{where}: cannot {doing} ({reason})", hint=hint, path=str(where))


# every error type but UsageError (exit 2 is also Click's), in declaration order
ERROR_TYPES: tuple[type[EaglectlError], ...] = tuple(c for c in EaglectlError.__subclasses__() if c is not UsageError)
# the specific failures' codes, as --help and the README say them (3-N)
SPECIFIC_EXIT_CODES = f"3-{max(c.exit_code for c in ERROR_TYPES if c.exit_code < 70)}"
