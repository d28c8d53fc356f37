"""Names shared by the key limits and the usage record: Redis keys, subjects, UTC days and months.

Every Redis key of this feature carries the hash tag `{gateway-keys}`, so one script may touch a key's and its
team's counters together on a Redis Cluster too.
"""

from __future__ import annotations

import calendar
import time

PREFIX = "keys:{gateway-keys}:"


def key_subject(key_id: str) -> str:
    return f"key:{key_id}"


def team_subject(team: str) -> str:
    return f"team:{team}"


def limit_key(kind: str, subject: str, family: str = "") -> str:
    return f"{PREFIX}limit:{kind}:{subject}:{family}"


def spend_key(month: str, subject: str) -> str:
    """Cost and tokens spent by a key or team in a month (`YYYY-MM`): the budgets' counter."""
    return f"{PREFIX}spend:{month}:{subject}"


def day_of(epoch: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


def month_of(epoch: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(epoch))


def seconds_to_next_day(epoch: float) -> float:
    return 86400 - epoch % 86400


def seconds_to_next_month(epoch: float) -> float:
    moment = time.gmtime(epoch)
    days = calendar.monthrange(moment.tm_year, moment.tm_mon)[1]
    start = calendar.timegm((moment.tm_year, moment.tm_mon, 1, 0, 0, 0))
    return start + days * 86400 - epoch
