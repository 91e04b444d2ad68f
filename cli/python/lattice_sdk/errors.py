"""Errors the API answers, as exceptions: the HTTP status, the message and the request field it names."""

from typing import Optional


class LatticeError(Exception):
    """An API error (or a transport failure, ``status_code`` None)."""

    def __init__(self, message: str, status_code: Optional[int] = None, field: Optional[str] = None, body=None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.field = field
        self.body = body

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        code = f"{self.status_code}: " if self.status_code else ""
        return f"{code}{self.message}{where}"


class LatticeValidationError(LatticeError):
    """400: the request is invalid; ``field`` names what."""


class LatticeAuthError(LatticeError):
    """401 or 403: no valid token, or the token's roles do not allow it."""


class LatticeNotFoundError(LatticeError):
    """404: no such allocation, DAG, node, ..."""


class LatticeConflictError(LatticeError):
    """409: the object is not in a state that allows it."""


class LatticeRateLimitError(LatticeError):
    """429 after the client's retries: ``retry_after`` seconds to wait."""

    def __init__(self, message: str, retry_after: float, **kw):
        super().__init__(message, **kw)
        self.retry_after = retry_after


def from_response(status: int, body) -> LatticeError:
    """The exception for an error answer (`{"error": ..., "field": ...}`)."""
    if isinstance(body, dict):
        message = str(body.get("error") or body.get("message") or body)
        field = body.get("field")
    else:
        message, field = str(body or f"HTTP {status}"), None
    kind = {
        400: LatticeValidationError,
        401: LatticeAuthError,
        403: LatticeAuthError,
        404: LatticeNotFoundError,
        409: LatticeConflictError,
    }.get(status, LatticeError)
    return kind(message, status_code=status, field=field, body=body)
