"""``python -m sa_outbox``: the same as the ``sa-outbox`` command.

Examples:
    import subprocess, sys
    subprocess.run([sys.executable, "-m", "sa_outbox", "--version"])
    # -> sa-outbox 0.1.0.dev0
"""

from __future__ import annotations

if __name__ == "__main__":
    from .cli import main

    raise SystemExit(main())
