#!/usr/bin/env python3
"""Sends the five plain demo prompts of docs/models.md to a running charm through the
OpenAI API (official `openai` client), greedy, and prints each answer verbatim with its
token counts and the client-side decode rate.

Usage: scripts/demo_prompts.py [--base-url http://127.0.0.1:8080/v1] [--max-tokens 80]
"""
from __future__ import annotations

import argparse
import time

from openai import OpenAI

PROMPTS = [
    "Hello! How are you today?",
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Translate into French: The weather is nice today and I am going for a walk.",
    "List five fruits that are red.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--max-tokens", type=int, default=80)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")
    model = client.models.list().data[0].id
    for i, prompt in enumerate(PROMPTS, 1):
        start = time.monotonic()
        first = None
        pieces = []
        usage = None
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        end = time.monotonic()
        tokens = usage.completion_tokens if usage else 0
        rate = (tokens - 1) / (end - first) if first and tokens > 1 and end > first else 0.0
        print(f"**{i}. {prompt}**  ({model}; {usage.prompt_tokens if usage else '?'} prompt tokens, "
              f"{tokens} generated, {rate:.1f} tok/s after the first)\n")
        print("".join(pieces))
        print()


if __name__ == "__main__":
    main()
