"""Finding and loading libdquant.so and libdquant-client.so.

Order: $DQUANT_LIB_DIR; this package's folder and its parent; the build folders of the source
tree this package sits in (``build/lib``, ``build/client/lib``, then any other ``build*``); finally the
system's library path (``ctypes.util.find_library``)."""

import ctypes
import ctypes.util
import os
import pathlib

_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parent.parent.parent   # client/python/dquant -> repository root


def _candidates(stem, subdir):
    names = [f"lib{stem}.so", f"lib{stem}.so.0", f"lib{stem}.dylib"]
    dirs = []
    env = os.environ.get("DQUANT_LIB_DIR")
    if env:
        dirs += [pathlib.Path(p) for p in env.split(os.pathsep) if p]
    dirs += [_HERE, _HERE.parent]
    builds = sorted(p for p in _REPO.glob("build*") if p.is_dir() and p.name != "build")
    for b in [_REPO / "build"] + builds:
        dirs.append(b / subdir)
    for d in dirs:
        for n in names:
            p = d / n
            if p.is_file():
                yield str(p)
    found = ctypes.util.find_library(stem)
    if found:
        yield found


_cache = {}


def load(stem, subdir):
    """Loads lib<stem> (``dquant`` from lib/, ``dquant-client`` from client/lib/); raises OSError
    naming every place tried."""
    if stem in _cache:
        return _cache[stem]
    tried = []
    for path in _candidates(stem, subdir):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        _cache[stem] = lib
        return lib
    raise OSError(f"lib{stem}.so not found: set DQUANT_LIB_DIR to the folder that holds it"
                  + (f" (tried: {'; '.join(tried)})" if tried else ""))


def path_of(lib):
    return getattr(lib, "_name", "?")
