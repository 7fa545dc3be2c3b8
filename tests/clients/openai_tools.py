"""The official OpenAI Python client's tool loop against a Skein server.

Usage: openai_tools.py BASE_URL TOKEN MODEL

Offers one tool; the model calls it (whole, then streamed through the client's own
stream accumulator); the script runs the tool, sends its result as a `tool` message and
checks the final answer names it. Prints `ok` and exits 0, or fails with the reason.
"""

import json
import sys

import openai

base_url, token, model = sys.argv[1:4]
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=token, max_retries=0, timeout=60)
tools = [{
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}]


def weather(arguments: str) -> str:
    city = json.loads(arguments)["text"]
    return f"sunny in {city}"


def loop(stream: bool) -> None:
    messages = [{"role": "user", "content": "Paris"}]
    if stream:
        with client.chat.completions.stream(model=model, messages=messages, tools=tools,
                                            tool_choice="required") as events:
            for _ in events:
                pass
            first = events.get_final_completion()
    else:
        first = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                               tool_choice="required")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name == "weather", choice.message
    messages.append(choice.message.model_dump(exclude_none=True))
    for call in calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": weather(call.function.arguments)})
    if stream:
        pieces = client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    else:
        final = client.chat.completions.create(model=model, messages=messages, tools=tools)
        assert final.choices[0].finish_reason == "stop", final
        text = final.choices[0].message.content
    assert "sunny in Paris" in text, text


loop(stream=False)
loop(stream=True)
print("ok")
