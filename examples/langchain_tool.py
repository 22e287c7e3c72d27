"""LangChain: a sandboxed Python tool for a LangChain agent.

    pip install langchain langchain-openai ./sdk/python && export OPENAI_API_KEY=...
    python examples/langchain_tool.py
"""

from roche_sandbox import Roche

roche = Roche()
TIMEOUT = 30  # seconds a program may run


def run_python(code: str) -> str:
    """Run Python code in an isolated sandbox (no network, 30 s) and return what it printed."""
    with roche.create() as sandbox:
        result = sandbox.exec(["python3", "-c", code], timeout=TIMEOUT)
    if result.timed_out:
        return f"Error: the code ran longer than {TIMEOUT} s and was stopped"
    if result.exit_code != 0:
        return f"Error (exit {result.exit_code}):\n{result.stderr}"
    return result.stdout


def main() -> None:
    try:
        from langchain.agents import create_agent
        from langchain.tools import tool
    except ImportError:
        raise SystemExit("this example needs LangChain 1.x: pip install langchain langchain-openai")
    agent = create_agent(model="openai:gpt-4o-mini", tools=[tool(run_python)])
    state = agent.invoke({"messages": [{"role": "user", "content": "Use Python to find the primes below 50."}]})
    print(state["messages"][-1].content)


if __name__ == "__main__":
    main()
