"""`python -m eaglectl` and the `eaglectl` script. Ctrl-C and SIGTERM are handled from before the CLI is imported
(`cli.main` then installs its own SIGTERM handler)."""

import sys

from .cli.interrupts import install

STOPPED = {130: "interrupted (Ctrl-C)", 143: "terminated (SIGTERM)"}


def _stop(code: int) -> None:
    sys.stderr.write(f"eaglectl: {STOPPED[code]}; no output was left behind\n")
    sys.exit(code)


def run() -> None:
    install(sigterm=lambda signum, frame: _stop(143))
    try:
        from .cli.app import main
    except KeyboardInterrupt:  # only where no import was under way to defer it to
        _stop(130)
    main()


if __name__ == "__main__":
    run()
