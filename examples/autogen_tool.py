"""AutoGen (AgentChat): an async tool on AsyncRoche, so tool calls never block the loop.

    pip install autogen-agentchat "autogen-ext[openai]" ./sdk/python && export OPENAI_API_KEY=...
    python examples/autogen_tool.py
"""

import asyncio

from roche_sandbox import AsyncRoche

roche = AsyncRoche()


async def run_python(code: str) -> str:
    """Run Python code in an isolated sandbox (no network, 30 s) and return its output."""
    async with (await roche.create()) as sandbox:
        result = await sandbox.exec(["python3", "-c", code], timeout=30)
    if result.exit_code != 0 or result.timed_out:
        return f"Error (exit {result.exit_code}{', timed out' if result.timed_out else ''}):\n{result.stderr}"
    return result.stdout


async def main() -> None:
    try:
        from autogen_agentchat.agents import AssistantAgent
        from autogen_ext.models.openai import OpenAIChatCompletionClient
    except ImportError:
        raise SystemExit('this example needs AutoGen: pip install autogen-agentchat "autogen-ext[openai]"')
    model = OpenAIChatCompletionClient(model="gpt-4o-mini")
    agent = AssistantAgent("coder", model_client=model, tools=[run_python],
                           system_message="Compute answers with the run_python tool.")
    result = await agent.run(task="What is 2**100 modulo 97?")
    print(result.messages[-1].content)
    await model.close()


if __name__ == "__main__":
    asyncio.run(main())
