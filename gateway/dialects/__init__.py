"""Front-ends: the client APIs the gateway speaks besides chat completions.

Each API (OpenAI Responses in ``responses/``, Anthropic Messages in ``messages/``) is one
``Frontend`` (``base.py``): it checks a request in its own shape, translates it to a chat
completions request (what quotas, routing and accounting understand, with the history split),
and translates a chat completions answer back - whole, or a stream chunk by chunk without
buffering - with errors in its own shape. A backend that speaks the API natively gets the
client's request unchanged instead (``api:`` on the backend); the pipeline decides which.
What a translation leaves out follows one rule (``ignored.py``): dropped and named in
``x-gateway-ignored``, or refused only when the request is translated.
"""

from __future__ import annotations

from gateway.dialects.base import Frontend, StreamTranslator, Translated

__all__ = ["Frontend", "StreamTranslator", "Translated"]
