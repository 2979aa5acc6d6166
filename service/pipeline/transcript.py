"""OpenAI's decision ``input`` → the state text the reader reads: one rendering, versioned.

A string is the state as it is, so the same text asked through ``/v1/systemone`` and through
``/v1/decisions`` is the same prompt (and the same probabilities). An item array becomes a
transcript, one block per item, in order, each opened by a bracketed header a small model reads as
a speaker turn::

    [system]
    Answer as the support desk.

    [user]
    Where is my parcel?

    [tool call get_status, call_1]
    {"order": 17}

    [tool result get_status, call_1]
    In transit, due Friday.

Message parts are joined by newlines; ``input_json`` parts are compact JSON (as Jev renders JSON
state); an assistant refusal part reads ``(refused) …``. A tool output names its call's tool, found by
``call_id`` among the calls before it (function outputs among function calls, custom tool outputs
among custom tool calls): an output without such a call is refused (400 naming the item), as is a
second call with a ``call_id`` already used. A call without an output is kept: the question may be
about it. A tool's name and a call id are written into headers, so the wire model holds them to
characters that cannot close one (``TOOL_NAME``, ``CALL_ID`` in service/protocol/openai_decisions.py). An ``input_image`` part reads ``[image]`` where it stands: the
images themselves come before the text, in order (``readers.images``), on an engine that reads them.

Changing any of this changes what the model reads: bump :data:`TRANSCRIPT_VERSION`, which every
``/v1/decisions`` response reports (``x_provenance.input_rendering``).
"""

from __future__ import annotations

from collections.abc import Sequence

from readers.errors import Loc
from readers.prompt import content_text
from service.protocol.openai_decisions import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputJson,
    InputText,
    Message,
    OutputText,
    RefusalPart,
)

TRANSCRIPT_VERSION = "decide-transcript/1"
CALL_TYPES = {FunctionCall: "function_call", CustomToolCall: "custom_tool_call"}


class TranscriptError(ValueError):
    """A request that cannot be read as a state and Jev questions; ``loc`` is the field's path under
    the body, ``code`` the error type (``invalid_input``, or ``unsupported_feature`` for an image)."""

    def __init__(self, loc: Loc, message: str, code: str = "invalid_input") -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.code = code


def render_input(value: str | Sequence[object]) -> str:
    """The state text for ``input``: a string unchanged, an item array as a transcript."""
    if isinstance(value, str):
        return value
    blocks: list[str] = []
    calls: dict[str, tuple[type, str]] = {}  # call_id → (the call's kind, its tool's name)
    for index, item in enumerate(value):
        loc = ("body", "input", index)
        if isinstance(item, Message):
            blocks.append(f"[{item.role}]\n{_message_text(item.content)}")
        elif isinstance(item, (FunctionCall, CustomToolCall)):
            if item.call_id in calls:
                raise TranscriptError(
                    (*loc, "call_id"),
                    f"input[{index}]: call_id {item.call_id!r} is already used by an earlier call",
                )
            calls[item.call_id] = (type(item), item.name)
            body = item.arguments if isinstance(item, FunctionCall) else item.input
            blocks.append(f"[tool call {item.name}, {item.call_id}]\n{body}")
        elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            wanted = FunctionCall if isinstance(item, FunctionCallOutput) else CustomToolCall
            kind, name = calls.get(item.call_id, (None, ""))
            if kind is not wanted:
                raise TranscriptError(
                    (*loc, "call_id"),
                    f"input[{index}]: {item.type} has no earlier {CALL_TYPES[wanted]} with call_id {item.call_id!r}",
                )
            blocks.append(f"[tool result {name}, {item.call_id}]\n{_output_text(item.output)}")
        else:  # the wire model admits nothing else
            raise AssertionError(f"unrendered input item {type(item).__name__}")
    return "\n\n".join(blocks)


def _message_text(content: str | Sequence[object]) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if isinstance(part, (InputText, OutputText)):
            texts.append(part.text)
        elif isinstance(part, InputJson):
            texts.append(content_text(part.data))
        elif isinstance(part, RefusalPart):
            texts.append(f"(refused) {part.refusal}")
        elif isinstance(part, InputImage):
            # The image itself is read before the state (in order); here it marks where it was sent.
            texts.append("[image]")
    return "\n".join(texts)


def _output_text(output: str | Sequence[object]) -> str:
    return output if isinstance(output, str) else _message_text(output)
