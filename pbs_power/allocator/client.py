"""A WebSocket client of the allocator: send one request, wait for its answer."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, Union

DEFAULT_URL = "ws://127.0.0.1:8765"


async def send_request(url: str, request: Union[str, Dict[str, Any]],
                       timeout: float = 120.0) -> Dict[str, Any]:
    """Connect, send ``request`` (a JSON text or an object), return the decoded answer."""
    import websockets
    text = request if isinstance(request, str) else json.dumps(request)
    async with websockets.connect(url, open_timeout=min(timeout, 30.0),
                                  max_size=64 * 1024 * 1024) as websocket:
        await websocket.send(text)
        answer = await asyncio.wait_for(websocket.recv(), timeout)
    return json.loads(answer)


def request_once(url: str, request: Union[str, Dict[str, Any]],
                 timeout: float = 120.0) -> Dict[str, Any]:
    """`send_request` from synchronous code."""
    return asyncio.run(send_request(url, request, timeout))
