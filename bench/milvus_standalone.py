"""How Milvus standalone 2.3.5 (the `milvus` package's `milvus-server`: embedded etcd, RocksMQ, local storage) is
started on this machine, by the soak, the search part and the tests alike: every port its own, the embedded etcd's
too, and the same ports again after a restart; and what they ask it besides the gateway's calls (whether it answers,
how far it has indexed a collection).

- Ports: milvus-server takes a `--x-port` only if it can bind it right now (without SO_REUSEADDR), else it quietly
  writes the next free port into milvus.yaml: a restart, while the stopped Milvus' connections sit in TIME_WAIT on
  its ports (60 s), came up on proxy port + 1 and never answered on ours. The same ports given as `--extra-config`
  are written over the probed ones, and Milvus binds them (Go listens with SO_REUSEADDR). The embedded etcd takes
  2379/2380 whatever `--etcd-port` says: an etcd config file given through `ETCD_CONFIG_PATH` sets its ports.
- Sessions: the previous process's node sessions outlive it in the embedded etcd (2.3.5 revokes only rootcoord's,
  and etcd extends every lease by a full TTL when it starts again): until they lapse the restarted Milvus calls its
  old node IDs ("node not match", milvus-io/milvus#26815) and searches fail, so the lease is 10 s, not 30 (kept
  through 40 s of three busy loops a core). Standalone's graceful stop never ends by itself (its query node waits
  to hand its segments to another node): it is cut short after 5 s.
- Time tick: a read that must see a write (the gateway's `Customized` guarantee right after one, `Strong` without
  Redis) waits until the query node has passed the write's timestamp, which moves one proxy time tick at a time:
  200 ms by default, 50 ms here (docs/operations.md, Scale: Milvus).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from gateway.search.milvus_rows import milvus_name
from localtriton.ports import free_port

VERSION = "2.3.5"
# milvus-server's port options and the milvus.yaml key each one lands in.
PORT_KEYS = {
    "proxy-port": "proxy.port", "proxy-internal-port": "proxy.internalPort", "etcd-port": "etcd.endpoints",
    "root-coord-port": "rootCoord.port", "query-coord-port": "queryCoord.port", "query-node-port": "queryNode.port",
    "index-node-port": "indexNode.port", "data-coord-port": "dataCoord.port", "data-node-port": "dataNode.port",
}  # fmt: skip
SETTINGS = {"common.session.ttl": "10", "common.gracefulStopTimeout": "5", "proxy.timeTickInterval": "50"}


@dataclass(frozen=True)
class MilvusLaunch:
    """The command that starts Milvus standalone on `data`, the environment it needs, and where it answers."""

    command: list[str]
    env: dict[str, str]
    proxy_port: int

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"


def milvus_launch(data: Path, proxy_port: int | None = None) -> MilvusLaunch:
    """Milvus standalone on the folder `data` (its data, logs and unpacked binaries), every port a free one (the
    proxy's `proxy_port` if given); run the same command again to restart it on the same ports."""
    binary = Path(sys.executable).with_name("milvus-server")
    if not binary.exists():
        raise RuntimeError(f"{binary} not found: install the dev extra (`pip install milvus=={VERSION}`)")
    data.mkdir(parents=True, exist_ok=True)
    ports = {name: free_port() for name in PORT_KEYS}
    if proxy_port is not None:
        ports["proxy-port"] = proxy_port
    client, peer = f"http://127.0.0.1:{ports['etcd-port']}", f"http://127.0.0.1:{free_port()}"
    etcd = data / "etcd.yaml"
    etcd.write_text(
        f"name: milvus\ndata-dir: {data / 'data' / 'etcd.data'}\n"
        f"listen-client-urls: {client}\nadvertise-client-urls: {client}\n"
        f"listen-peer-urls: {peer}\ninitial-advertise-peer-urls: {peer}\ninitial-cluster: milvus={peer}\n"
    )
    command = [str(binary), "--data", str(data)]
    for name, port in ports.items():
        command += [f"--{name}", str(port)]
    pinned = {key: str(ports[name]) for name, key in PORT_KEYS.items()}
    pinned["etcd.endpoints"] = f"localhost:{ports['etcd-port']}"
    for key, value in {**pinned, **SETTINGS}.items():
        command += ["--extra-config", f"{key}={value}"]
    return MilvusLaunch(command, {"ETCD_CONFIG_PATH": str(etcd)}, ports["proxy-port"])


def milvus_answers(uri: str) -> bool:
    """Whether Milvus at `uri` answers a call."""
    try:
        client = MilvusClient(uri=uri, timeout=3)
    except (MilvusException, grpc.RpcError):  # refused, or a connect that timed out while Milvus starts
        return False
    try:
        client.list_collections(timeout=3)
        return True
    except (MilvusException, grpc.RpcError):
        return False
    finally:
        client.close()


def milvus_index_progress(uri: str, collection: str) -> tuple[int, int] | None:
    """(indexed rows, rows) of the gateway collection's vector index, as Milvus counts them (sealed segments only);
    None while Milvus does not answer."""
    try:
        client = MilvusClient(uri=uri, timeout=5)
    except (MilvusException, grpc.RpcError):
        return None
    try:
        (index,) = client.list_indexes(milvus_name(collection), timeout=5)
        described = client.describe_index(milvus_name(collection), index, timeout=5)
        return int(described["indexed_rows"]), int(described["total_rows"])
    except (MilvusException, grpc.RpcError):
        return None
    finally:
        client.close()
