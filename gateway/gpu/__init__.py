"""GPU-aware protection: the GPUs' state read from Prometheus text (`metrics_text`), judged per GPU (`policy`), applied
to the gateway's calls (`protection`), and polled off the request path (`poller`)."""
