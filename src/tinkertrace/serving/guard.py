"""Around every route of the endpoint and the proxy: authentication, errors in OpenAI's format, and
(for LLM routes, with a recorder) the call recorded as an LLM span."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from tinkertrace.sdk.llm_call import call_kind
from tinkertrace.serving.openai_wire.errors import ApiError
from tinkertrace.serving.recording import CallRecorder, Handler

log = logging.getLogger(__name__)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def check_token(request: Request, expected: str, what: str) -> None:
    """A 401 :class:`ApiError` unless the request's Bearer token is ``expected``."""
    token = _bearer(request)
    if token is None:
        raise ApiError(
            401,
            f"You didn't provide {what}. Send it in an 'Authorization: Bearer ...' header.",
            code="invalid_api_key",
        )
    if not hmac.compare_digest(token.encode(), expected.encode()):
        shown = token[:3] + "*" * max(0, len(token) - 7) + token[-4:] if len(token) > 8 else "***"
        raise ApiError(401, f"Incorrect {what} provided: {shown}.", code="invalid_api_key")


def guarded(
    handler: Handler,
    authenticate: Callable[[Request], None],
    recorder: CallRecorder | None = None,
) -> Handler:
    """``handler`` behind ``authenticate`` (raises :class:`ApiError`), every failure answered in OpenAI's
    error format; with a ``recorder``, an LLM request and its answer (errors included) recorded."""

    async def run(request: Request) -> Response:
        call = None
        try:
            authenticate(request)
            kind = call_kind(request.url.path) if recorder and request.method == "POST" else None
            if kind is not None:
                assert recorder is not None
                call = await recorder.open_call(request, kind)
            response = await handler(request)
        except ApiError as err:
            response = err.response()
        except ValueError as exc:  # the sampler refused the request (e.g. a prompt beyond the context)
            response = ApiError(400, f"The sampler rejected the request: {exc}").response()
        except Exception as exc:
            log.exception("request to %s failed", request.url.path)
            response = ApiError(500, f"The server failed to answer: {exc}", type="server_error").response()
        if call is not None:
            assert recorder is not None
            return await recorder.close_call(call, response)
        return response

    return run
