"""What every section of the policy model shares: the strict struct base and the field types.

Kept apart from the sections so each section module (``pools``, ``catalog``, ``routing``,
``tenants``, ``server``) depends on this one alone, never on another section it does not use.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = [
    "Amount",
    "Duration",
    "Name",
    "PolicyStruct",
    "PositiveFloat",
    "PositiveInt",
    "seconds",
]


Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/@-]+$")]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


class PolicyStruct(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Policy structs reject unknown fields, so a typo is an error rather than a silent default."""


#: a duration: seconds as a number, or a string with a unit ("500ms", "90s", "5m", "1h")
Duration = Annotated[str, msgspec.Meta(pattern=r"^\d+(\.\d+)?(ms|s|m|h)$")] | Annotated[
    float, msgspec.Meta(gt=0)]
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(duration: str | float) -> float:
    """A :data:`Duration` in seconds ("5m" -> 300.0, 1.5 -> 1.5)."""
    if not isinstance(duration, str):
        return float(duration)
    unit = "ms" if duration.endswith("ms") else duration[-1]
    return float(duration[: -len(unit)]) * _UNITS[unit]


#: a price or a spend bound in the price currency: a decimal string keeps it exact
Amount = Annotated[str, msgspec.Meta(pattern=r"^\d+(\.\d+)?$")] | int | float
