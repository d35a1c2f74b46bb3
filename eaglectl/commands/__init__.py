"""One module (or folder) per command: parse nothing, build nothing of the terminal; a request in, a Result out."""

from .. import families  # noqa: F401  (the families' checks join the rule registry before any command runs one)
