"""One module (or folder) per command: parse nothing, build nothing of the terminal; a request in, a Result out."""
