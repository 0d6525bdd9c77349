"""Balance monitor routes: POST/GET /accounts/{id}/monitors, DELETE /accounts/{id}/monitors/{monitor_id}."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.responses import responses
from api.rules import ADMIN, SERVICE, only, path_arg
from api.schemas import Threshold
from hotledger import errors
from hotledger.monitors.feature import monitors
from hotledger.monitors.service import Monitor
from hotledger.runtime import currencies

router = Router()
UserId = Annotated[int, Path(gt=0, lt=2**31)]
_NOT_FOUND = (404, "ACCOUNT_NOT_FOUND or MONITOR_NOT_FOUND")


class MonitorRequest(BaseModel):
    """Either below (with rearm_above, default: below) or above (with rearm_below, default: above)."""

    model_config = ConfigDict(extra="forbid")
    below: Threshold | None = None
    rearm_above: Threshold | None = None
    above: Threshold | None = None
    rearm_below: Threshold | None = None

    @model_validator(mode="after")
    def one_direction(self) -> MonitorRequest:
        one_way = (self.below is None) != (self.above is None)
        mixed = (self.below is not None and self.rearm_below is not None) or (
            self.above is not None and self.rearm_above is not None
        )
        if not one_way or mixed:
            raise ValueError("give below (and rearm_above) or above (and rearm_below)")
        return self


class MonitorView(BaseModel):
    monitor_id: str
    user_id: int
    direction: str = Field(description="below or above")
    threshold: str
    rearm: str = Field(description="the line the balance goes back past to arm it again")
    armed: bool = Field(description="false after it fired, until the balance is back past the re-arm line")


def _view(m: Monitor) -> dict[str, Any]:
    format_minor = currencies().of(m.user_id).format
    return {
        "monitor_id": str(m.monitor_id),
        "user_id": m.user_id,
        "direction": m.direction,
        "threshold": format_minor(m.threshold),
        "rearm": format_minor(m.rearm),
        "armed": m.armed,
    }


@router.post(
    "/accounts/<user_id>/monitors",
    status_code=201,
    responses=responses(
        201,
        MonitorView,
        "watching: one balance.below / balance.above event and inbox message per crossing",
        _NOT_FOUND,
        (422, "INVALID_MONITOR: the re-arm line on the wrong side, or too many monitors; VALIDATION_ERROR"),
    ),
)
def create_monitor(user_id: UserId, request: Annotated[MonitorRequest, Body()]) -> dict[str, Any]:
    def minor(value: Decimal | None, field: str) -> int | None:
        return None if value is None else currencies().minor(user_id, value, field)

    if request.below is not None:
        below = currencies().minor(user_id, request.below, "below")
        return _view(monitors().create(user_id, "below", below, minor(request.rearm_above, "rearm_above")))
    if request.above is not None:
        above = currencies().minor(user_id, request.above, "above")
        return _view(monitors().create(user_id, "above", above, minor(request.rearm_below, "rearm_below")))
    raise errors.DomainError("give below or above")  # never: one_direction refuses a request with neither


@router.get(
    "/accounts/<user_id>/monitors", responses=responses(200, list[MonitorView], "the account's monitors", _NOT_FOUND)
)
def list_monitors(user_id: UserId) -> list[dict[str, Any]]:
    return [_view(m) for m in monitors().list(user_id)]


# no return annotation: Powertools makes it the answer's schema (a 204 has none; the OpenAPI document would change,
# for Response[str] and Response[None] alike), so --strict's no-untyped-def is ignored here alone
@router.delete("/accounts/<user_id>/monitors/<monitor_id>", responses=responses(204, None, "removed", _NOT_FOUND))
def delete_monitor(user_id: UserId, monitor_id: Annotated[int, Path(gt=0, lt=2**63)]):  # type: ignore[no-untyped-def]
    monitors().delete(user_id, monitor_id)
    return Response(status_code=204, body="")


# users watch their own balance; services and operators any account's
RULES = {
    ("POST", "/accounts/<user_id>/monitors"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
    ("GET", "/accounts/<user_id>/monitors"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
    ("DELETE", "/accounts/<user_id>/monitors/<monitor_id>"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
}
