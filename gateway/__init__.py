"""LLM inference gateway: one OpenAI-compatible endpoint in front of many inference backends."""
