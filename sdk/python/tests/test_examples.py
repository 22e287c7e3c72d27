"""The agent-framework examples: their tool functions against real sandboxes (the
frameworks cannot be installed here, so each example's framework is imported only by
its main), and the seed's OpenAI Agents snippet as written, with a stand-in agents module."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import types
from typing import Any, Callable
from unittest import mock

import harness

EXAMPLES = os.path.join(harness.REPO, "examples")

SEED_OPENAI = '''
from agents import Agent, Runner, function_tool
from roche_sandbox import Roche

roche = Roche()

@function_tool
def execute_python(code: str) -> str:
    """Execute Python code in a secure sandbox."""
    with roche.create() as sandbox:
        result = sandbox.exec(["python3", "-c", code])
        if result.exit_code != 0:
            return f"Error:\\n{result.stderr}"
        return result.stdout

agent = Agent(
    name="Coder",
    instructions="You can run Python code using execute_python.",
    tools=[execute_python],
)
'''


def load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ExamplesTest(harness.SandboxTestCase):
    def check_tool(self, tool: Callable[[str], str]) -> None:
        self.assertEqual(tool("print(6 * 7)"), "42\n")
        failed = tool("1 / 0")
        self.assertTrue(failed.startswith("Error"), failed)
        self.assertIn("ZeroDivisionError", failed)

    def test_openai_agents(self) -> None:
        m = load("openai_agents_tool")
        self.check_tool(m.execute_python)
        self.assertEqual(m.roche.transport, "daemon")

    def test_langchain(self) -> None:
        m = load("langchain_tool")
        self.check_tool(m.run_python)
        m.TIMEOUT = 1
        self.assertIn("longer than 1 s", m.run_python("import time; time.sleep(60)"))

    def test_crewai(self) -> None:
        self.check_tool(load("crewai_tool").run_python)

    def test_autogen(self) -> None:
        m = load("autogen_tool")
        self.check_tool(lambda code: asyncio.run(m.run_python(code)))

    def test_anthropic(self) -> None:
        m = load("anthropic_tool_use")
        ok = m.run_tool({"type": "tool_use", "id": "toolu_1", "name": "run_python", "input": {"code": "print('hi')"}})
        self.assertEqual(ok, {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hi\n", "is_error": False})
        bad = m.run_tool({"type": "tool_use", "id": "toolu_2", "name": "run_python", "input": {"code": "1/0"}})
        self.assertTrue(bad["is_error"])
        self.assertIn("ZeroDivisionError", bad["content"])
        self.assertEqual(m.TOOL["input_schema"]["required"], ["code"])

    def test_main_without_the_framework_says_what_to_install(self) -> None:
        for name, package in [("openai_agents_tool", "openai-agents"), ("langchain_tool", "langchain"),
                              ("crewai_tool", "crewai"), ("anthropic_tool_use", "anthropic"),
                              ("autogen_tool", "autogen-agentchat")]:
            m = load(name)
            blocked = {"agents": None, "langchain": None, "langchain.agents": None, "langchain.tools": None,
                       "crewai": None, "crewai.tools": None, "anthropic": None,
                       "autogen_agentchat": None, "autogen_agentchat.agents": None}
            with mock.patch.dict(sys.modules, blocked), self.assertRaises(SystemExit) as cm:
                result = m.main()
                if asyncio.iscoroutine(result):
                    asyncio.run(result)
            self.assertIn(f"pip install {package}", str(cm.exception))

    def test_seed_openai_snippet_as_written(self) -> None:
        made: dict[str, Any] = {}

        class Agent:
            def __init__(self, **kw: Any) -> None:
                made.update(kw)

        stand_in = types.ModuleType("agents")
        stand_in.Agent = Agent  # type: ignore[attr-defined]
        stand_in.Runner = object  # type: ignore[attr-defined]
        stand_in.function_tool = lambda fn: fn  # type: ignore[attr-defined]
        ns: dict[str, Any] = {}
        with mock.patch.dict(sys.modules, {"agents": stand_in}):
            exec(compile(SEED_OPENAI, "<seed>", "exec"), ns)
        (tool,) = made["tools"]
        self.assertEqual(tool("print('hello')"), "hello\n")
        self.assertIn("NameError", tool("undefined_name"))
