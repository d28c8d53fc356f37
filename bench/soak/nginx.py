"""nginx as the soak's load balancer, where the Kubernetes Service and ingress stand: its config, generated into
the run's folder."""

from __future__ import annotations

from pathlib import Path

NGINX_ACCESS_LOG = "nginx-access.log"
# $msec: end of the request (Unix seconds); the soak id ties a line to the load generator's record. "|" apart:
# $upstream_addr and $upstream_status list one entry per replica tried, ", " apart.
NGINX_LOG_FORMAT = "$msec|$status|$request_time|$upstream_addr|$upstream_status|$http_x_soak_id|$request_method|$uri"


def nginx_config(prefix: Path, access_log: Path, port: int, upstreams: list[int]) -> str:
    """A load balancer as the ingress stands: round robin, keep-alive to the replicas, a refused connection
    tried on the next replica (a request already sent is not: nginx cannot know whether it ran)."""
    servers = "\n".join(f"    server 127.0.0.1:{upstream} max_fails=1 fail_timeout=2s;" for upstream in upstreams)
    temp = prefix / "temp"
    return f"""daemon off;
worker_processes 1;
pid {prefix / "nginx.pid"};
events {{ worker_connections 4096; }}
http {{
  log_format soak '{NGINX_LOG_FORMAT}';
  access_log {access_log} soak;
  client_body_temp_path {temp / "body"};
  proxy_temp_path {temp / "proxy"};
  fastcgi_temp_path {temp / "fastcgi"};
  uwsgi_temp_path {temp / "uwsgi"};
  scgi_temp_path {temp / "scgi"};
  client_max_body_size 16m;
  # Bodies stay in memory: a worker (another user when the soak runs as root) may not reach the run folder.
  client_body_buffer_size 16m;
  upstream gateways {{
{servers}
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://gateways;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_buffering off;
      proxy_read_timeout 300s;
      proxy_next_upstream error timeout;
      proxy_next_upstream_tries 3;
    }}
  }}
}}
"""
