"""The package as installed: metadata, exports, error codes and the messages of a failed load."""

import ctypes
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

import dquant
import dquant.client
import dquant.codec


class TestPackage(unittest.TestCase):
    def test_version_is_the_projects(self):
        # the package's, libdquant-client's and (under meson) the project's version agree
        self.assertRegex(dquant.__version__, r"^\d+\.\d+\.\d+$")
        self.assertEqual(dquant.client_version(), dquant.__version__)
        want = os.environ.get("DQUANT_PROJECT_VERSION")
        if want:
            self.assertEqual(dquant.__version__, want)

    def test_installed_not_the_source_tree(self):
        # run_tests.py installs into a venv and sets DQUANT_EXPECT_PREFIX: the tests must see that copy
        prefix = os.environ.get("DQUANT_EXPECT_PREFIX")
        if not prefix:
            self.skipTest("not run by tests/python/run_tests.py (no installed copy to check)")
        here = pathlib.Path(dquant.__file__).resolve()
        self.assertTrue(str(here).startswith(str(pathlib.Path(prefix).resolve())), here)
        self.assertTrue((here.parent / "py.typed").is_file(), "py.typed not installed")

    def test_all_is_complete(self):
        for mod in (dquant, dquant.client, dquant.codec):
            for name in mod.__all__:
                self.assertTrue(hasattr(mod, name), f"{mod.__name__}.{name}")
        for name in ("Client", "Codec", "Profile", "DquantError", "ClientError", "chunk_keys", "LookupResult"):
            self.assertIn(name, dquant.__all__)

    def test_public_api_is_annotated(self):
        import inspect
        for fn in (dquant.Client.__init__, dquant.Client.put, dquant.Client.get, dquant.Client.attend,
                   dquant.Client.lookup, dquant.Client.put_chunks, dquant.Client.get_chunk, dquant.Client.get_chunks,
                   dquant.Client.register_model, dquant.chunk_keys,
                   dquant.roundtrip, dquant.Codec.roundtrip, dquant.Codec.attend, dquant.Profile.builtin):
            sig = inspect.signature(fn)
            self.assertIsNot(sig.return_annotation, inspect.Signature.empty, fn.__qualname__)
            for p in sig.parameters.values():
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    self.assertIsNot(p.annotation, inspect.Parameter.empty, f"{fn.__qualname__}({p.name})")
            self.assertTrue(fn.__doc__, fn.__qualname__)


class TestErrors(unittest.TestCase):
    def test_error_codes_match_both_c_tables(self):
        dq, dqc = dquant.codec.library(), dquant.client.library()
        for code in dquant.ErrorCode:
            self.assertEqual(dq.dq_err_name(int(code)).decode(), code.name)
            self.assertEqual(dqc.dqc_err_name(int(code)).decode(), code.name)
        self.assertEqual(dquant.error_name(-13), "NOT_FOUND")
        self.assertEqual(dquant.error_name(-9999), "UNKNOWN")

    def test_codec_error_carries_code_name_message(self):
        with self.assertRaises(dquant.DquantError) as cm:
            dquant.Profile.builtin("dq999", 8, 128)
        e = cm.exception
        self.assertEqual((e.code, e.name), (dquant.ErrorCode.PROFILE, "PROFILE"))
        self.assertEqual(e.code, -7)
        self.assertIn("profile", e.message)
        self.assertTrue(str(e).startswith("dq999: PROFILE: "), str(e))
        with self.assertRaises(dquant.DquantError) as cm:
            dquant.Profile.make(2, 128, container_bytes=(8, 8), levels=(8, 6))
        self.assertEqual(cm.exception.name, "CONTAINER_TOO_SMALL")

    def test_client_error_is_a_dquant_error(self):
        self.assertTrue(issubclass(dquant.ClientError, dquant.DquantError))
        self.assertTrue(issubclass(dquant.UnsupportedError, dquant.DquantError))
        self.assertTrue(issubclass(dquant.UnsupportedError, NotImplementedError))
        e = dquant.UnsupportedError("lookup", "no dqc_lookup")
        self.assertEqual((e.code, e.name), (-20, "UNSUPPORTED"))
        import pickle
        e2 = pickle.loads(pickle.dumps(dquant.ClientError(-13, "get", "no such sequence", "NOT_FOUND")))
        self.assertEqual((type(e2), e2.code, e2.name, e2.message), (dquant.ClientError, -13, "NOT_FOUND",
                                                                    "no such sequence"))

    def test_connect_failure_raises_connection(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(dquant.ClientError) as cm:
                dquant.Client(f"unix:{d}/none.sock", timeout_ms=2000, auto_reconnect=False)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.CONNECTION)
        self.assertIn("connect unix:", str(cm.exception))

    def test_library_not_found_says_what_to_do(self):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, DQUANT_LIB_DIR=d)
            env.pop("LD_LIBRARY_PATH", None)
            r = subprocess.run([sys.executable, "-c", "import dquant.client as c; c.library()"], env=env,
                               capture_output=True, text=True, cwd=d)
        if r.returncode == 0:
            self.skipTest("libdquant-client is also installed system-wide (found without DQUANT_LIB_DIR)")
        if "site-packages" not in dquant.__file__ and "dist-packages" not in dquant.__file__:
            self.skipTest("run from the source tree, whose build folders are searched")
        self.assertIn("libdquant-client.so not found", r.stderr)
        self.assertIn("export DQUANT_LIB_DIR=", r.stderr)
        self.assertIn("meson install -C build", r.stderr)
        self.assertIn(d, r.stderr)                 # names where it looked

    def test_layouts_match_the_c_headers(self):
        """ctypes structs vs the C compiler's sizeof/offsetof (tests/python/layout_probe.c)."""
        probe = os.environ.get("DQUANT_LAYOUT_PROBE")
        if not probe:
            self.skipTest("DQUANT_LAYOUT_PROBE not set (meson test sets it)")
        lines = subprocess.run([probe], capture_output=True, text=True, check=True).stdout.split("\n")
        seen = 0
        for line in filter(None, lines):
            name, value = line.split()
            if "." in name:
                sname, field = name.split(".")
                cls = (getattr(dquant.client, sname, None) or getattr(dquant.cluster, sname, None)
                       or getattr(dquant.codec, sname))
                self.assertEqual(getattr(cls, field).offset, int(value), name)
            else:
                cls = (getattr(dquant.client, name, None) or getattr(dquant.cluster, name, None)
                       or getattr(dquant.codec, name))
                self.assertEqual(ctypes.sizeof(cls), int(value), f"sizeof({name})")
                seen += 1
        self.assertGreaterEqual(seen, 10)


if __name__ == "__main__":
    unittest.main()
