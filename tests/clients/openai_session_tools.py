"""The official OpenAI Python client's tool loop in a Skein session.

Usage: openai_session_tools.py BASE_URL TOKEN MODEL SESSION

The same loop as openai_tools.py, but the session holds the history: each request
sends only its new messages (the session named by `session_id` in the body, or by the
`X-Skein-Session` header). The model's message that called the tool is sent back with
the tool's result, as an OpenAI loop does; the session does not store it twice. Whole,
then streamed. Prints `ok` and exits 0, or fails with the reason.
"""

import json
import sys

import openai

base_url, token, model, session = sys.argv[1:5]
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=token, max_retries=0, timeout=60)
tools = [{
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}]
in_body = {"extra_body": {"session_id": session}}
in_header = {"extra_headers": {"X-Skein-Session": session}}


def weather(arguments: str) -> str:
    city = json.loads(arguments)["text"]
    return f"sunny in {city}"


def loop(city: str, stream: bool) -> None:
    new = [{"role": "user", "content": city}]
    if stream:
        with client.chat.completions.stream(model=model, messages=new, tools=tools,
                                            tool_choice="required", **in_body) as events:
            for _ in events:
                pass
            first = events.get_final_completion()
    else:
        first = client.chat.completions.create(model=model, messages=new, tools=tools,
                                               tool_choice="required", **in_body)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name == "weather", choice.message
    new = [choice.message.model_dump(exclude_none=True)]
    for call in calls:
        new.append({"role": "tool", "tool_call_id": call.id, "content": weather(call.function.arguments)})
    if stream:
        pieces = client.chat.completions.create(model=model, messages=new, tools=tools, stream=True, **in_header)
        text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    else:
        final = client.chat.completions.create(model=model, messages=new, tools=tools, **in_header)
        assert final.choices[0].finish_reason == "stop", final
        text = final.choices[0].message.content
    assert f"sunny in {city}" in text, text


loop("Paris", stream=False)
loop("Rome", stream=True)
print("ok")
