"""CrewAI: an agent whose code runs in a Roche sandbox.

    pip install crewai ./sdk/python && export OPENAI_API_KEY=...
    python examples/crewai_tool.py
"""

from roche_sandbox import Roche

roche = Roche()


def run_python(code: str) -> str:
    """Run Python code in an isolated sandbox (no network, 30 s) and return its output."""
    with roche.create() as sandbox:
        result = sandbox.exec(["python3", "-c", code], timeout=30)
    if result.exit_code != 0 or result.timed_out:
        return f"Error (exit {result.exit_code}{', timed out' if result.timed_out else ''}):\n{result.stderr}"
    return result.stdout


def main() -> None:
    try:
        from crewai import Agent, Crew, Task
        from crewai.tools import tool
    except ImportError:
        raise SystemExit("this example needs CrewAI: pip install crewai")
    python_tool = tool("Run Python")(run_python)
    analyst = Agent(
        role="Data analyst",
        goal="Answer questions by computing, never by guessing",
        backstory="You write small Python programs and run them with the Run Python tool.",
        tools=[python_tool],
    )
    task = Task(
        description="How many Sundays fell on the first of the month during the 20th century?",
        expected_output="The number, with the program that computed it",
        agent=analyst,
    )
    print(Crew(agents=[analyst], tasks=[task]).kickoff())


if __name__ == "__main__":
    main()
