"""A function engine for HTTP-semantics tests: wraps a plain function, reaches no model.

Named as such so no test mistakes it for a real read: reading, calibration and end-to-end tests use
the local engine (the embedded model) or vLLM. Use it to inject faults a real engine cannot produce on demand.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from readers.engines.base import Capabilities, ClosingEngine, EngineReply, ModelInfo, ReadRequest

ReadFunction = Callable[[ReadRequest], EngineReply | Awaitable[EngineReply]]


class FunctionEngine(ClosingEngine):
    kind = "function"

    def __init__(
        self, fn: ReadFunction, *, tokenizer: Any, info: ModelInfo, capabilities: Capabilities
    ) -> None:
        self._fn = fn
        self.tokenizer = tokenizer
        self.info = info
        self.capabilities = capabilities

    async def read(self, request: ReadRequest) -> EngineReply:
        result = self._fn(request)
        return await result if inspect.isawaitable(result) else result
