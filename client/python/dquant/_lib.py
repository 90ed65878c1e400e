"""Finding and loading libdquant.so and libdquant-client.so.

Order, first match wins:

1. ``$DQUANT_LIB_DIR`` (one folder, or several separated by ``:``);
2. this package's folder and its parent (copy the ``.so`` files there to ship them with the package);
3. when the package sits in a dquant source tree (``client/python/dquant``): its build folders,
   ``build/lib`` and ``build/client/lib``, then those of every other ``build*`` folder;
4. what ``meson install`` installs to with the default prefix: ``/usr/local/lib/<multiarch>`` and
   ``/usr/local/lib``;
5. the system's library path: the library's name given to the dynamic loader (``LD_LIBRARY_PATH``,
   the ldconfig cache) and ``ctypes.util.find_library``.

An installed package (``pip install``) is not inside the source tree, so a library built but not
installed is found only through ``$DQUANT_LIB_DIR`` (or 2.); the error says so."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import sysconfig
from typing import Dict, Iterator, List, Tuple

_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parent.parent.parent   # client/python/dquant -> the source tree's root, when it is one


def _in_source_tree() -> bool:
    return (_REPO / "meson.build").is_file() and (_REPO / "client" / "python" / "dquant").is_dir()


def _install_dirs() -> List[pathlib.Path]:
    arch = sysconfig.get_config_var("MULTIARCH")
    dirs = [pathlib.Path("/usr/local/lib") / arch] if arch else []
    return dirs + [pathlib.Path("/usr/local/lib"), pathlib.Path("/usr/local/lib64")]


def search_dirs(subdir: str) -> List[pathlib.Path]:
    """The folders searched for a library built in ``subdir`` of a build folder ("lib", "client/lib")."""
    dirs: List[pathlib.Path] = []
    env = os.environ.get("DQUANT_LIB_DIR")
    if env:
        dirs += [pathlib.Path(p) for p in env.split(os.pathsep) if p]
    dirs += [_HERE, _HERE.parent]
    if _in_source_tree():
        others = sorted(p for p in _REPO.glob("build*") if p.is_dir() and p.name != "build")
        dirs += [b / subdir for b in [_REPO / "build"] + others]
    return dirs + _install_dirs()


def _candidates(stem: str, subdir: str) -> Iterator[str]:
    names = [f"lib{stem}.so", f"lib{stem}.so.0", f"lib{stem}.dylib"]
    for d in search_dirs(subdir):
        for n in names:
            p = d / n
            if p.is_file():
                yield str(p)
    yield f"lib{stem}.so"              # the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache)
    found = ctypes.util.find_library(stem)
    if found:
        yield found


_cache: Dict[str, ctypes.CDLL] = {}


def _not_found(stem: str, subdir: str, tried: List[Tuple[str, str]]) -> OSError:
    dirs = ", ".join(str(d) for d in search_dirs(subdir))
    where = "/path/to/dquant"
    if _in_source_tree():
        where = str(_REPO)
    msg = [f"lib{stem}.so not found or not loadable. Either",
           "  - build it (in the dquant source tree: meson setup build && ninja -C build) and point the",
           f"    binding at the build: export DQUANT_LIB_DIR={where}/build/lib:{where}/build/client/lib",
           "  - or install it: meson install -C build (then, as root, ldconfig),",
           f"  - or copy lib{stem}.so* into {_HERE}.",
           f"Searched: {dirs}; then the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache)."]
    if tried:
        msg.append("Found but failed to load: " + "; ".join(f"{p} ({e})" for p, e in tried))
    return OSError("\n".join(msg))


def load(stem: str, subdir: str) -> ctypes.CDLL:
    """Loads lib<stem> (``dquant`` from lib/, ``dquant-client`` from client/lib/). Raises OSError
    saying what to do and naming every place tried."""
    if stem in _cache:
        return _cache[stem]
    tried: List[Tuple[str, str]] = []
    for path in _candidates(stem, subdir):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            if "/" in path:              # a bare name that the loader does not know is not worth naming
                tried.append((path, str(e)))
            continue
        _cache[stem] = lib
        return lib
    raise _not_found(stem, subdir, tried)


def path_of(lib: ctypes.CDLL) -> str:
    """The path a library was loaded from (resolved through /proc/self/maps for a bare name)."""
    name = getattr(lib, "_name", "?")
    if "/" in name:
        return name
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith(".so") or (".so." in line):
                    p = line.split()[-1]
                    if os.path.basename(p).startswith(name.split(".so")[0] + ".so"):
                        return p
    except OSError:
        pass
    return name
