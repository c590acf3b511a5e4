"""The server's API key: with one, every endpoint but /health wants it, as `Authorization: Bearer
KEY`, or on the page in a browser as HTTP Basic with any user name and the key as password."""

from __future__ import annotations

import hmac

from fastapi import Request
from fastapi.security import HTTPBasic, HTTPBearer
from starlette.exceptions import HTTPException

from eaglespec.serve.openai_schema import ApiError


class ApiKey:
    """A FastAPI dependency: refuses a request without the key (401, in OpenAI's error shape)."""

    def __init__(self, key: str | None):
        self.key = key
        self.bearer, self.basic = HTTPBearer(auto_error=False), HTTPBasic(auto_error=False, realm="eaglespec")

    async def __call__(self, request: Request) -> None:
        if not self.key or request.url.path == "/health":
            return
        token = await self.bearer(request)
        try:
            login = None if token else await self.basic(request)
        except HTTPException:  # a malformed Basic header
            login = None
        given = token.credentials if token else login.password if login else ""
        if not hmac.compare_digest(given.strip().encode(), self.key.encode()):
            page = request.url.path == "/"
            raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'"
                           + (" (in a browser: any user name, the key as password)" if page else ""),
                           code="invalid_api_key", headers=self.basic.make_authenticate_headers() if page else None)
