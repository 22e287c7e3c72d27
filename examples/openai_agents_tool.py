"""OpenAI Agents SDK: the seed's execute_python as a function tool.

    pip install openai-agents ./sdk/python && export OPENAI_API_KEY=...
    python examples/openai_agents_tool.py
"""

from roche_sandbox import Roche

roche = Roche()


def execute_python(code: str) -> str:
    """Execute Python code in a secure sandbox."""
    with roche.create() as sandbox:
        result = sandbox.exec(["python3", "-c", code])
        if result.exit_code != 0:
            return f"Error:\n{result.stderr}"
        return result.stdout


def main() -> None:
    try:
        from agents import Agent, Runner, function_tool
    except ImportError:
        raise SystemExit("this example needs the OpenAI Agents SDK: pip install openai-agents")
    agent = Agent(
        name="Coder",
        instructions="You can run Python code using execute_python.",
        tools=[function_tool(execute_python)],
    )
    result = Runner.run_sync(agent, "What is the 30th Fibonacci number? Compute it with Python.")
    print(result.final_output)


if __name__ == "__main__":
    main()
