"""Server-sent events, as OpenAI frames them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse


def sse_response(
    events: list[dict[str, Any]], headers: dict[str, str], *, named: bool = False, delay_s: float = 0.0
) -> StreamingResponse:
    """Chat and completion chunks (``data: {...}``) end with ``data: [DONE]``; Responses events
    (``named``) are each preceded by ``event: <type>`` and end with the final event. ``delay_s``
    waits before each event (the test server's simulated latency)."""

    async def frames() -> AsyncIterator[bytes]:
        for event in events:
            if delay_s:
                await asyncio.sleep(delay_s)
            head = f"event: {event['type']}\n".encode() if named else b""
            yield head + b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
        if not named:
            yield b"data: [DONE]\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)
