"""The OpenAI request bodies the server takes, checked field by field: the fields users send are
honoured, fields whose non-default values we cannot honour are refused (never silently ignored),
and fields we do not know are ignored, as OpenAI-compatible servers do. Extensions: `top_k`, and
`method` (a decoding method by its `eaglespec generate --method` name, e.g. "vanilla")."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SEED_LIMIT = 2**63


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None  # None: 1, as OpenAI
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    seed: Annotated[int, Field(ge=-SEED_LIMIT, lt=SEED_LIMIT)] | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    method: str | None = None
    # refused unless left at their defaults
    logprobs: bool | int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        if self.n not in (None, 1):
            raise ApiError(400, "n > 1 is not supported; send one request per completion", "n")
        for name in ("logprobs", "presence_penalty", "frequency_penalty", "logit_bias"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported by this server; leave it out", name)
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of > 1 is not supported; leave it out", "best_of")

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)]
    echo: bool | None = False
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise ApiError(400, "echo is not supported; leave it out", "echo")
        if self.suffix:
            raise ApiError(400, "suffix (insertion) is not supported; leave it out", "suffix")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value):
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and part.get("type") not in (None, "text"):
                    raise ValueError(f"content of type {part.get('type')!r} is not supported; send text")
        return value

    def as_template_input(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list | None = None
    response_format: dict | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools:
            raise ApiError(400, "tools are not supported by this server; leave them out", "tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ApiError(400, "response_format other than text is not supported", "response_format")


def parse(kind: type[Sampling], body: object) -> Sampling:
    """The request from its JSON body, or a 400 naming the first bad field."""
    check_text(body)
    try:
        request = kind.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']}", where) from None
    request.check_supported()
    return request


def check_text(value: object, depth: int = 0) -> None:
    """Refuse text that is not Unicode (lone surrogates, which JSON escapes allow) and nesting no
    request needs."""
    if depth > 32:
        raise ApiError(400, "the request body is nested too deeply")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "the request contains text that is not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, depth + 1)
            check_text(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_text(item, depth + 1)
