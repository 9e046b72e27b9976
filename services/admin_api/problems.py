"""The admin API's errors as RFC 9457 problem details: the shape every error is written in, documented on
every route."""

from http import HTTPStatus
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel

PROBLEM = "application/problem+json"


class ProblemOut(BaseModel):
    """RFC 9457 problem details, as every error of this API is written."""

    type: str = "about:blank"
    title: str
    status: int
    detail: Any


def problem_doc(description: str) -> dict[str, Any]:
    return {"description": description, "content": {PROBLEM: {"schema": ProblemOut.model_json_schema()}}}


# Documented on every /v1 route, so clients (and schemathesis) know the error shape.
PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: problem_doc("no token, or one the ledger does not know"),
    403: problem_doc("a viewer token tried to write, or to read the audit log"),
    404: problem_doc("not found (a scoped viewer also gets this for other tenants)"),
    422: problem_doc("the request is invalid; the detail names the field"),
}


def problem(status: int, title: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status, media_type=PROBLEM, headers=headers,
    )


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


class Problem(HTTPException):
    """An error whose title is short and whose detail carries the specifics (CEL's message, known names)."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(status, detail)
        self.title = title
