"""The official OpenAI Python client's embeddings against a Skein server.

Usage: openai_embeddings.py BASE_URL TOKEN MODEL WIDTH

Asks for two texts' vectors as the client does by default (base64, which it decodes)
and as floats; checks one vector per input, in order, WIDTH wide, the same in both
encodings, under the model's name, with the tokens read. Prints `ok` and exits 0, or
fails with the reason.
"""

import sys

import openai

base_url, token, model, width = sys.argv[1:5]
width = int(width)
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=token, max_retries=0, timeout=120)
texts = ["The capital of France is Paris.", "Photosynthesis turns light into sugar."]
default = client.embeddings.create(model=model, input=texts)
floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
for answer in (default, floats):
    assert [d.index for d in answer.data] == [0, 1], answer
    assert all(len(d.embedding) == width for d in answer.data), [len(d.embedding) for d in answer.data]
    assert answer.model == model, answer.model
    assert answer.usage.prompt_tokens > 0, answer.usage
for a, b in zip(default.data, floats.data):
    gap = max(abs(x - y) for x, y in zip(a.embedding, b.embedding))
    assert gap < 1e-5, f"base64 and float vectors differ by {gap}"
assert default.data[0].embedding != default.data[1].embedding, "two texts, one vector"
print("ok")
