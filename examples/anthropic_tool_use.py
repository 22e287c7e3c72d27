"""Anthropic tool use: Claude asks for code to be run; Roche runs it in a sandbox.

    pip install anthropic ./sdk/python && export ANTHROPIC_API_KEY=...
    python examples/anthropic_tool_use.py
"""

from typing import Any

from roche_sandbox import Roche

roche = Roche()

TOOL = {
    "name": "run_python",
    "description": "Run Python 3 code in an isolated sandbox (no network, 30 s limit). Returns what it printed.",
    "input_schema": {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The program to run"}},
        "required": ["code"],
    },
}


def run_tool(block: dict[str, Any]) -> dict[str, Any]:
    """Runs one tool_use block and returns its tool_result block."""
    with roche.create() as sandbox:
        result = sandbox.exec(["python3", "-c", block["input"]["code"]], timeout=30)
    failed = result.exit_code != 0 or result.timed_out
    return {
        "type": "tool_result",
        "tool_use_id": block["id"],
        "content": (result.stdout + result.stderr) if failed else result.stdout,
        "is_error": failed,
    }


def main() -> None:
    try:
        import anthropic
    except ImportError:
        raise SystemExit("this example needs the Anthropic SDK: pip install anthropic")
    client = anthropic.Anthropic()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the 50th prime? Check with Python."}]
    while True:
        reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=1024, tools=[TOOL], messages=messages)
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            print("".join(b.text for b in reply.content if b.type == "text"))
            return
        results = [run_tool(b.model_dump()) for b in reply.content if b.type == "tool_use"]
        messages.append({"role": "user", "content": results})


if __name__ == "__main__":
    main()
