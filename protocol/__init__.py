"""The wire protocol (docs/architecture.md, Wire protocol): framing (`framing`), typed access to control fields
(`fields`) and one typed message per API request and response (`messages`). Pure: no sockets,
no asyncio. Everything callers need is importable from here."""
from protocol.fields import entries, entry_field, field
from protocol.framing import (
    REQUEST_HEADER,
    REQUEST_HEADER_AFTER_SIZE,
    RESPONSE_HEADER,
    SUPPORTED_VERSIONS,
    ApiKey,
    Frame,
    FrameBudget,
    FrameDecoder,
    MalformedRequest,
    OversizeRequest,
    Request,
    Response,
    ResponseDecoder,
    ScratchPool,
    encode_request,
    encode_response,
)
from protocol.messages import *  # noqa: F403 - the messages are part of the protocol's surface
from protocol.messages import __all__ as _message_names

__all__ = [
    "REQUEST_HEADER", "REQUEST_HEADER_AFTER_SIZE", "RESPONSE_HEADER", "SUPPORTED_VERSIONS", "ApiKey", "Frame",
    "FrameBudget", "FrameDecoder", "MalformedRequest", "OversizeRequest", "Request", "Response", "ResponseDecoder",
    "ScratchPool", "encode_request", "encode_response", "entries", "entry_field", "field", *_message_names,
]
