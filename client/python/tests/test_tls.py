"""TLS through the binding (issue 18): Client("tls://...", tls_ca=..., tls_cert=..., tls_key=...)
against a real dquantd with --tls-cert/--tls-key, without and with client certificates
(--tls-client-ca). Certificates are made here with the openssl CLI in a temporary folder."""

import os
import shutil
import socket
import subprocess
import tempfile
import unittest

import dquant
from dqtest import Daemon, need_numpy, nmse, np

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def make_certs(d: str) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=py-ca")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("req", *EC, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=dquantd")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "server.ext", "-out", "server.pem")
    run("req", *EC, "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=py-engine")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-out", "client.pem")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestTls(unittest.TestCase):
    def setUp(self):
        need_numpy()
        if not shutil.which("openssl"):
            raise unittest.SkipTest("the openssl CLI is not installed")
        self.dir = tempfile.mkdtemp(prefix="dquant-pytls-")
        make_certs(self.dir)
        self.daemon = None

    def tearDown(self):
        if self.daemon:
            self.daemon.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def p(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def start(self, mutual: bool) -> str:
        port = free_port()
        extra = ["--listen", f"tcp://127.0.0.1:{port}", "--tls-cert", self.p("server.pem"),
                 "--tls-key", self.p("server.key")]
        if mutual:
            extra += ["--tls-client-ca", self.p("ca.pem")]
        self.daemon = Daemon(*extra)
        return f"tls://127.0.0.1:{port}"

    def round_trip(self, c: dquant.Client) -> None:
        c.register_model("py", layers=2, q_heads=4, kv_heads=2, head_dim=64, profile="dq226")
        rng = np.random.default_rng(7)
        k = rng.standard_normal((2, 200, 2, 64)).astype(np.float32)
        v = rng.standard_normal((2, 200, 2, 64)).astype(np.float32)
        self.assertEqual(c.put("t", k, v, model="py")["tokens"], 200)
        kg, vg = c.get("t")
        self.assertLess(nmse(k, kg), 0.05)
        with self.daemon.client() as u:                  # the plaintext Unix socket sees the same
            ku, vu = u.get("t")
            self.assertTrue(np.array_equal(kg, ku) and np.array_equal(vg, vu))
        q = rng.standard_normal((4, 64)).astype(np.float32)
        out, lse = c.attend("t", layer=1, q=q)
        self.assertTrue(np.all(np.isfinite(out)) and np.all(lse > 0))

    def test_round_trip_server_certificate(self):
        addr = self.start(mutual=False)
        with dquant.Client(addr, tls_ca=self.p("ca.pem"), timeout_ms=10000) as c:
            self.round_trip(c)
        with self.assertRaises(dquant.ClientError) as cm:   # the server's CA is not trusted
            dquant.Client(addr, tls_ca=self.p("client.pem"), timeout_ms=10000)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.UNAUTHENTICATED)

    def test_round_trip_client_certificate(self):
        addr = self.start(mutual=True)
        with dquant.Client(addr, tls_ca=self.p("ca.pem"), tls_cert=self.p("client.pem"),
                           tls_key=self.p("client.key"), timeout_ms=10000) as c:
            self.round_trip(c)
        with self.assertRaises(dquant.ClientError) as cm:   # no client certificate
            dquant.Client(addr, tls_ca=self.p("ca.pem"), timeout_ms=10000)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.UNAUTHENTICATED)


if __name__ == "__main__":
    unittest.main()
