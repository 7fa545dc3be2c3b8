"""Renders conversations with a chat template the way `transformers` does, for
inference/tests/chat_templates.rs.

Reads one JSON object on stdin:
    {"template": str, "bos_token": str | null, "eos_token": str | null,
     "tools": [OpenAI tool definition] | null,
     "cases": [{"messages": [{"role": str, "content": str, "tool_calls"?: [...],
                              "tool_call_id"?: str}], "add_generation_prompt": bool}]}
and writes a JSON list with one entry per case: {"text": str} when it renders, or
{"error": str, "kind": str} (the exception's message and class) when it does not.

The rendering is `transformers`' own public path: a fast tokenizer carrying the
template and the special tokens, then `apply_chat_template(tokenize=False)`.
"""

import json
import sys

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast


def main():
    request = json.load(sys.stdin)
    special = {
        key: request[key]
        for key in ("bos_token", "eos_token")
        if request.get(key) is not None
    }
    vocab = {"<unk>": 0}
    for token in special.values():
        vocab.setdefault(token, len(vocab))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        chat_template=request["template"],
        **special,
    )
    results = []
    for case in request["cases"]:
        try:
            text = tokenizer.apply_chat_template(
                case["messages"],
                tokenize=False,
                add_generation_prompt=case["add_generation_prompt"],
                tools=request.get("tools"),
            )
            results.append({"text": text})
        except Exception as error:  # the template's own refusal, among others
            results.append({"error": str(error), "kind": type(error).__name__})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
