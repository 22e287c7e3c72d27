"""roched's secret store through the SDK (set_secret, list_secrets, remove_secret), over
both transports, sync and async, against the real roched and CLI: the value never on
the CLI's command line, rotation reaching a sandbox that took the secret from the store,
and a clear error for a name not stored."""

import asyncio
import os
import shutil
import stat
import tempfile
import uuid

import harness
from roche_sandbox import AsyncRoche, Roche, RocheError, SandboxNotFound, Secret


def unique(prefix: str) -> str:
    # The harness's roched is shared by every test of the process: names of their own.
    return f"{prefix}_{uuid.uuid4().hex[:8].upper()}"


class SecretStore(harness.SandboxTestCase):
    def check_set_list_rm(self, roche: Roche) -> None:
        name, value = unique("SDK_TOKEN"), "tok-" + uuid.uuid4().hex
        self.assertEqual(roche.set_secret(name, value), [])  # no sandbox uses it: none rotated
        got = {s.name: s for s in roche.list_secrets()}
        self.assertIn(name, got)
        self.assertEqual(got[name].sandboxes, [])
        self.assertIsNotNone(got[name].updated)
        self.assertNotIn(value, repr(roche.list_secrets()))
        roche.remove_secret(name)
        self.assertNotIn(name, [s.name for s in roche.list_secrets()])
        # A name not stored (here: removed): a clear error, the not-found kind.
        with self.assertRaises(SandboxNotFound) as cm:
            roche.remove_secret(name)
        self.assertIn(f"secret {name} is not in roched's secret store", str(cm.exception))
        # Bad input is refused with the reason, never echoing the value.
        with self.assertRaises(RocheError) as bad:
            roche.set_secret(name, "two\nlines")
        self.assertIn("control character", str(bad.exception))
        self.assertNotIn("two", str(bad.exception))

    def test_set_list_rm(self) -> None:
        for transport in harness.TRANSPORTS:
            with self.subTest(transport=transport):
                roche = Roche(transport=transport)
                self.addCleanup(roche.close)
                self.assertEqual(roche.transport, transport)
                self.check_set_list_rm(roche)

    def test_set_list_rm_async(self) -> None:
        async def main(transport: str) -> None:
            roche = AsyncRoche(transport=transport)
            try:
                name, value = unique("SDK_ASYNC"), "tok-" + uuid.uuid4().hex
                self.assertEqual(await roche.set_secret(name, value), [])
                self.assertIn(name, [s.name for s in await roche.list_secrets()])
                await roche.remove_secret(name)
                with self.assertRaises(SandboxNotFound):
                    await roche.remove_secret(name)
            finally:
                roche.close()
        for transport in harness.TRANSPORTS:
            with self.subTest(transport=transport):
                asyncio.run(main(transport))

    def test_value_never_on_the_cli_command_line(self) -> None:
        # The SDK's CLI transport runs the program given as cli=: here a wrapper that
        # records every command line it is given, then runs the real roche with it.
        tmp = tempfile.mkdtemp(prefix="roche-sdk-argv-")
        self.addCleanup(shutil.rmtree, tmp, True)
        log = os.path.join(tmp, "argv.log")
        wrapper = os.path.join(tmp, "roche")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{harness.CLI}" "$@"\n')
        os.chmod(wrapper, stat.S_IRWXU)
        name, value = unique("SDK_ARGV"), "tok-argv-" + uuid.uuid4().hex
        roche = Roche(transport="cli", cli=wrapper)
        self.addCleanup(roche.close)
        roche.set_secret(name, value)
        self.assertIn(name, [s.name for s in roche.list_secrets()])
        roche.remove_secret(name)
        with open(log) as f:
            lines = f.read().splitlines()
        self.assertIn(f"secret set {name}", lines)  # the wrapper saw the calls...
        self.assertIn("secret list --json", lines)
        self.assertFalse([line for line in lines if value in line], lines)  # ...never the value

    def test_rotation_reaches_a_sandbox(self) -> None:
        # One sandbox takes the secret from the store; setting it again (through either
        # transport) names it as rotated, and list_secrets names it as a user.
        name = unique("SDK_ROTATE")
        host = "127.0.0.14:1"  # nothing is sent there: rotation is what is checked
        roche = Roche(transport="daemon")
        self.addCleanup(roche.close)
        cli = Roche(transport="cli")
        self.addCleanup(cli.close)
        roche.set_secret(name, "tok-v1")
        self.addCleanup(roche.remove_secret, name)
        with roche.create(image=harness.image(), network_allowlist=[host],
                          secrets=[Secret(name, [host], from_store=True)]) as sb:
            self.assertEqual(roche.set_secret(name, "tok-v2"), [sb.id])
            self.assertEqual(cli.set_secret(name, "tok-v3"), [sb.id])
            users = {s.name: s.sandboxes for s in cli.list_secrets()}
            self.assertEqual(users.get(name), [sb.id])
            # That sandbox's secret only: returns it, and stores nothing new.
            self.assertEqual(roche.set_secret(name, "tok-only-there", sandbox=sb), [sb.id])
            self.assertEqual(cli.set_secret(name, "tok-only-there-2", sandbox=sb.id), [sb.id])
            env = sb.exec(["sh", "-c", "echo $" + name]).stdout
            self.assertTrue(env.startswith("roche-secret-"), env)
