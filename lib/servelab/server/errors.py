"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the right HTTP status.

Status codes the server answers with:

- 400 ``invalid_request_error``: malformed JSON, wrong types, out-of-range values (``top_logprobs`` > 20,
  ``n`` > 128, penalties, ``top_k`` < -1), token ids outside the vocabulary, an empty prompt, prompt +
  max_tokens beyond the context, an unsupported option (``suffix``, JSON ``response_format``), chat on a
  model without a chat template (unknown fields are not errors: they are ignored and logged);
- 401 ``authentication_error``: missing or wrong API key;
- 404 ``not_found_error``: unknown route or model name;
- 413 ``invalid_request_error`` (code ``body_too_large``): body over ``--max-body-bytes``;
- 429 ``rate_limit_error`` (code ``queue_full``) with ``Retry-After``: too many requests waiting;
- 503 ``service_unavailable`` (code ``shutting_down``) with ``Retry-After``: the server is draining;
- 500 ``internal_error``: a bug (the engine raised); the message says what.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error to answer with; raised anywhere in a request handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def from_validation_error(e: ValidationError) -> APIError:
    """The first pydantic error as a 400; JSON syntax errors say "malformed JSON"."""
    errs = e.errors(include_url=False)
    first = errs[0] if errs else {"loc": (), "msg": str(e), "type": ""}
    if first["type"] == "json_invalid":
        return APIError(
            400, f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}", code="malformed_json"
        )
    loc = [str(p) for p in first["loc"] if not isinstance(p, int)]
    # a union reports the branch it tried ("prompt.str"); the field is what the client wrote
    param = loc[0] if loc else None
    more = f" (and {len(errs) - 1} more error(s))" if len(errs) > 1 else ""
    field = ".".join(str(p) for p in first["loc"]) or "body"
    return APIError(400, f"{field}: {first['msg']}{more}", param=param, code=first["type"])


def install_handlers(app, on_error=None) -> None:
    """Every error the app can raise answers in OpenAI's shape; ``on_error(status)`` counts them."""

    def answer(err: APIError) -> JSONResponse:
        if on_error is not None:
            on_error(err.status)
        return err.response()

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError):
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        msg = errs[0]["msg"] if errs else "invalid request"
        return answer(APIError(400, msg))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return answer(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return answer(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))
