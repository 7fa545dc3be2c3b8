"""The official Anthropic Python client's tool loop against a Skein server.

Usage: anthropic_tools.py BASE_URL TOKEN MODEL

Offers one tool; the model answers with a `tool_use` block (whole, then streamed
through the client's own event accumulator); the script runs the tool, sends its
`tool_result` and checks the final text names it. The token goes as `x-api-key`, as
the client sends keys. Prints `ok` and exits 0, or fails with the reason.
"""

import sys

import anthropic

base_url, token, model = sys.argv[1:4]
client = anthropic.Anthropic(base_url=base_url, api_key=token, max_retries=0, timeout=60)
tools = [{
    "name": "weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}]


def ask(stream: bool, messages):
    arguments = dict(model=model, max_tokens=64, system="Be brief.", tools=tools, messages=messages)
    if not stream:
        return client.messages.create(**arguments)
    with client.messages.stream(**arguments) as events:
        for _ in events:
            pass
        return events.get_final_message()


def loop(stream: bool) -> None:
    messages = [{"role": "user", "content": "Paris"}]
    first = ask(stream, messages)
    assert first.stop_reason == "tool_use", first
    uses = [b for b in first.content if b.type == "tool_use"]
    assert uses and uses[0].name == "weather" and uses[0].input == {"text": "Paris"}, first
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": f"sunny in {use.input['text']}"} for use in uses
    ]})
    final = ask(stream, messages)
    assert final.stop_reason == "end_turn", final
    text = "".join(b.text for b in final.content if b.type == "text")
    assert "sunny in Paris" in text, text
    assert final.usage.output_tokens > 0, final.usage


loop(stream=False)
loop(stream=True)
print("ok")
