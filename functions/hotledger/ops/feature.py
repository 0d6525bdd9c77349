"""The operators' console's registration (hotledger.features): admin routes only; it reads the other features'
stores and replays into the writer's transport, and owns the operators' log (t_ops_log)."""

from __future__ import annotations

from hotledger.features import Feature

FEATURE = Feature(name="ops", routes="hotledger.ops.routes")
