"""Secrets and learn mode through the SDK, against the real roched (sync and async)."""

import asyncio
import http.server
import threading

import harness
from roche_sandbox import AsyncRoche, Roche, Secret

# A GET of argv[1] carrying $API_TOKEN, printing the status (403 when refused).
CODE = """import os, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + os.environ.get('API_TOKEN', '')})
try:
    print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


class EgressSecretsThroughDaemon(harness.SandboxTestCase):
    def setUp(self) -> None:
        super().setUp()
        srv = http.server.HTTPServer(("127.0.0.14", 0), _Hello)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        self.addr = "127.0.0.14:%d" % srv.server_address[1]

    def test_secret_crosses_as_a_placeholder(self) -> None:
        # The value crosses to roched; the sandbox holds a placeholder, and the proxy
        # refuses it on a request it cannot put the value in (plain HTTP).
        value = "tok-sdk-3e8d1c0b7a"
        roche = Roche(transport="daemon")
        self.addCleanup(roche.close)
        with roche.create(image=harness.image(), network_allowlist=[self.addr],
                          secrets=[Secret("API_TOKEN", [self.addr], value=value, header="Authorization")]) as sb:
            env = sb.exec(["sh", "-c", "echo $API_TOKEN"]).stdout
            self.assertTrue(env.startswith("roche-secret-"), env)
            self.assertNotIn(value, env)
            r = sb.exec(["python3", "-c", CODE, "http://%s/" % self.addr])
            self.assertIn("403", r.stdout)
            self.assertIn("placeholder of secret API_TOKEN", r.stdout)
            self.assertNotIn(value, repr(sb.egress_log()))

    def test_egress_learn_async(self) -> None:
        async def main() -> None:
            roche = AsyncRoche(transport="daemon")
            try:
                async with await roche.create(image=harness.image(), egress_learn=True) as sb:
                    r = await sb.exec(["python3", "-c", CODE, "http://%s/" % self.addr])
                    self.assertTrue(r.stdout.startswith("403"), r.stdout)  # learn mode opens nothing
                    self.assertEqual(await sb.egress_suggest(), [self.addr])
            finally:
                roche.close()
        asyncio.run(main())

    def test_stored_secret_not_in_store(self) -> None:
        roche = Roche(transport="daemon")
        self.addCleanup(roche.close)
        with self.assertRaises(Exception) as cm:
            roche.create(image=harness.image(), network_allowlist=[self.addr],
                         secrets=[Secret("NOT_STORED_SDK", [self.addr], from_store=True)])
        self.assertIn("roche secret set NOT_STORED_SDK", str(cm.exception))
