"""python -m dquant: what the installed binding finds (versions, library paths, optional calls)."""

import sys

from . import __version__, _lib, client, codec


def main() -> int:
    print(f"dquant (Python) {__version__}")
    rc = 0
    for name, load in (("libdquant", codec.library), ("libdquant-client", client.library)):
        try:
            print(f"{name}: {_lib.path_of(load())}")
        except OSError as e:
            print(f"{name}: not found\n{e}")
            rc = 1
    if rc == 0:
        print(f"libdquant-client version: {client.version()}")
        for sym in client.CHUNK_SYMBOLS:
            have = client.has_symbols(sym)
            print(f"  {sym}: {'yes' if have else 'no (the shared KV tier calls raise UnsupportedError)'}")
        for sym in client.RAW_SYMBOLS:
            have = client.has_symbols(sym)
            print(f"  {sym}: {'yes' if have else 'no (the compressed transfer calls raise UnsupportedError)'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
