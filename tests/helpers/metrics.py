"""Reading one sample from a running gateway's /metrics."""

from __future__ import annotations

import httpx


def metric(http: httpx.Client, base_url: str, name: str, **labels: str) -> float:
    """The value of one sample in a gateway's /metrics (0 when absent)."""
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in http.get(f"{base_url}/metrics").text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == wanted:
            return float(value)
    return 0.0
