"""A private Redis Cluster on loopback, started and stopped by PID.

Used by the test suite and the benchmarks. Like everything in ``testproject.harness``
it never touches a server it did not start: every node gets a free port (at most
55535, its cluster bus 10000 above) and a directory of its own, and only the PIDs of
those nodes are ever signalled.

The topology is always read live from the nodes (``CLUSTER NODES``), never
remembered: a failover moves slots from one node to another, and a restarted master
comes back as a replica.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from testproject.harness import RedisServer, free_cluster_port, wait_until

# Flags under which a node is not (or not yet) a working member, as a peer sees it.
_UNHEALTHY_FLAGS = frozenset({"fail", "fail?", "handshake", "noaddr"})


@dataclass(frozen=True)
class ClusterNodeState:
    """One line of ``CLUSTER NODES`` (or of a node's ``nodes.conf``)."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None  # None for a master
    slots: tuple[tuple[int, int], ...]  # inclusive ranges, importing/migrating ones left out

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def slot_count(self) -> int:
        return sum(end - start + 1 for start, end in self.slots)

    @classmethod
    def parse(cls, line: str) -> ClusterNodeState:
        node_id, address, flags, master, _ping, _pong, _epoch, _link, *slots = line.split()
        # 127.0.0.1:7000@17000[,hostname]
        port = int(address.split("@", 1)[0].rsplit(":", 1)[1])
        ranges = []
        for token in slots:
            if token.startswith("["):  # a slot being migrated: still owned as listed elsewhere
                continue
            start, _, end = token.partition("-")
            ranges.append((int(start), int(end or start)))
        return cls(
            node_id=node_id,
            port=port,
            flags=frozenset(flags.split(",")),
            master_id=None if master == "-" else master,
            slots=tuple(ranges),
        )


def parse_cluster_nodes(text: str) -> dict[str, ClusterNodeState]:
    """``CLUSTER NODES`` (or a ``nodes.conf``, whose ``vars`` line is skipped), by node id."""
    nodes = (
        ClusterNodeState.parse(line)
        for line in text.splitlines()
        if line.strip() and not line.startswith("vars ")
    )
    return {node.node_id: node for node in nodes}


@dataclass
class ClusterNodeServer(RedisServer):
    """A ``RedisServer`` with cluster mode on, its ``nodes.conf`` in its directory (so a
    restarted node rejoins with its identity), failed after ``node_timeout_ms`` of
    silence. Started, waited for and stopped as every private server is."""

    node_timeout_ms: int = 1000

    def args(self) -> list[str]:
        return [
            *super().args(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.directory / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A master holds a full sync 5 s by default, waiting for more replicas to
            # share the transfer: every start and every rejoin would pay it.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip


class ClusterGroup:
    """A private Redis Cluster: `masters` masters, each with `replicas` replicas (by
    default one each; none for a single master, the only count below 3 it builds).

    Every node is a ``RedisServer`` (AOF everysec, noeviction, its own directory) with
    cluster mode on and its ``nodes.conf`` in that directory, so a restarted node
    rejoins with its identity. ``node_timeout_ms`` is both how long a silent master has
    before it is failed and (times ten) how stale a replica may be and still take
    over; the default of one second makes a failover take two to three seconds.
    ``start()`` returns once every node agrees on the whole topology.
    """

    def __init__(
        self,
        directory: Path,
        masters: int = 3,
        replicas: int | None = None,
        password: str | None = None,
        node_timeout_ms: int = 1000,
    ) -> None:
        # redis-cli --cluster create refuses fewer than 3 masters. One master, without
        # replicas, is built by hand instead (``_create_single``): a cluster whose only
        # master serves every slot, for a benchmark's baseline. No replica there: with
        # one master no majority could ever vote a replica in.
        if replicas is None:
            replicas = 0 if masters == 1 else 1
        if masters == 1:
            if replicas:
                raise ValueError("a 1-master cluster has no replicas: none could be failed over to")
        elif masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters (or just 1), not {masters}")
        self.directory = directory
        self.master_count = masters
        self.replica_count = replicas
        self.password = password
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> ClusterGroup:
        for i in range(self.master_count * (1 + self.replica_count)):
            directory = self.directory / f"node-{i}"
            node = ClusterNodeServer(
                directory=directory,
                # Each node listens before the next port is drawn: no two draw the same.
                port=free_cluster_port(),
                password=self.password,
                node_timeout_ms=self.node_timeout_ms,
            )
            # Recorded before it runs, so stop() reaches it even if a later step fails.
            self.nodes.append(node)
            node.start()
        if self.master_count == 1:
            self._create_single()
        else:
            self._create()
        self.wait_settled(60, what="the new cluster to settle")
        return self

    def _create(self) -> None:
        binary = shutil.which("redis-cli")
        if binary is None:
            raise RuntimeError("redis-cli is not on PATH: run ./scripts/bootstrap.sh")
        env = dict(os.environ)
        if self.password:
            # Not -a: it would show in ps, and redis-cli warns about it on stderr.
            env["REDISCLI_AUTH"] = self.password
        else:
            env.pop("REDISCLI_AUTH", None)  # one of the caller's would be sent to our nodes
        args = [
            binary, "--cluster", "create",
            *(f"127.0.0.1:{node.port}" for node in self.nodes),
            "--cluster-replicas", str(self.replica_count),
            "--cluster-yes",
        ]  # fmt: skip
        result = subprocess.run(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        # redis-cli exits 0 on some failures; "[OK] All 16384 slots covered." is the verdict.
        if result.returncode != 0 or "[OK] All 16384 slots covered" not in result.stdout:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({result.returncode}):\n"
                f"{result.stdout[-3000:]}{result.stderr[-2000:]}"
            )

    def _create_single(self) -> None:
        """One node serving all 16384 slots (``CLUSTER ADDSLOTSRANGE``, Redis >= 7.0);
        ``start`` then waits for its ``cluster_state:ok``."""
        (node,) = self.nodes
        with node.client() as client:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, REDIS_CLUSTER_HASH_SLOTS - 1)

    def restart(self, node: RedisServer, timeout_s: float = 30) -> None:
        """Start a killed node again on its directory (AOF and ``nodes.conf``); returns
        once the cluster has taken it back. A master that was failed over rejoins as a
        replica of the node that took its slots, and resynchronises from it."""
        node.restart()
        self.wait_settled(timeout_s, what=f"node {node.port} to rejoin the cluster")

    def stop(self) -> None:
        """Stop every node by PID."""
        for node in self.nodes:
            node.stop()

    # -- topology ---------------------------------------------------------------------

    @staticmethod
    def alive(node: RedisServer) -> bool:
        return node.alive()

    def live_nodes(self) -> list[RedisServer]:
        return [node for node in self.nodes if self.alive(node)]

    def _node_client(self, node: RedisServer) -> redis.Redis:
        client = node.client(decode_responses=True)
        # The raw text, not redis-py's dict: the same parser then reads nodes.conf.
        client.set_response_callback("CLUSTER NODES", lambda response, **_: response)
        return client

    def view(self, node: RedisServer) -> dict[str, ClusterNodeState]:
        """The cluster as ``node`` sees it, by node id."""
        with self._node_client(node) as client:
            return parse_cluster_nodes(client.execute_command("CLUSTER NODES"))

    def _any_view(self, exclude: RedisServer | None = None) -> dict[str, ClusterNodeState]:
        """The view of the first live node that answers."""
        errors = []
        for node in self.live_nodes():
            if node is exclude:
                continue
            try:
                return self.view(node)
            except redis.exceptions.RedisError as exc:
                errors.append(f"{node.port}: {exc}")
        raise RuntimeError(f"no node of the cluster answers: {errors}")

    def _server(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def node_id(self, node: RedisServer) -> str:
        """The node's cluster id, from its own ``nodes.conf`` (answers for a dead node too)."""
        return self._own_line(node).node_id

    def _own_line(self, node: RedisServer) -> ClusterNodeState:
        # Redis rewrites nodes.conf (and fsyncs it) at every change of its config, so a
        # node's file is its last view even after a SIGKILL.
        text = (node.directory / "nodes.conf").read_text()
        return next(n for n in parse_cluster_nodes(text).values() if "myself" in n.flags)

    def masters(self) -> list[RedisServer]:
        """The masters that serve slots now, by their first slot (read live: a failover
        changes them). A master killed but not yet failed over is still listed."""
        owners = [n for n in self._any_view().values() if n.is_master and n.slots]
        owners.sort(key=lambda n: min(start for start, _ in n.slots))
        return [self._server(n.port) for n in owners]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The nodes that replicate ``master`` now."""
        master_id = self.node_id(master)
        # Another node's view: it answers while the master is paused, stopped or dead.
        view = self._any_view(exclude=master)
        return [self._server(n.port) for n in view.values() if n.master_id == master_id]

    def master_of_slot(self, slot: int) -> RedisServer:
        if not 0 <= slot < REDIS_CLUSTER_HASH_SLOTS:
            raise ValueError(f"no such slot: {slot}")
        for n in self._any_view().values():
            if n.is_master and any(start <= slot <= end for start, end in n.slots):
                return self._server(n.port)
        raise RuntimeError(f"no master serves slot {slot}")

    def node_of_key(self, key: str | bytes) -> RedisServer:
        """The master serving the key's slot (hash tags apply, as in the client)."""
        return self.master_of_slot(key_slot(key.encode() if isinstance(key, str) else key))

    # -- clients ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """A seed URL for ``RedisCluster.from_url``: a live master (the client finds the
        rest of the cluster through it)."""
        master = next(node for node in self.masters() if self.alive(node))
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{master.port}"

    def client(self, **kwargs: Any) -> RedisCluster:
        """A new cluster client seeded with every live node, so that it starts even
        while a node is down."""
        if self.password:
            kwargs.setdefault("password", self.password)
        kwargs.setdefault("socket_timeout", 5)
        startup = [ClusterNode("127.0.0.1", node.port) for node in self.live_nodes()]
        return RedisCluster(startup_nodes=startup, **kwargs)

    # -- waiting ----------------------------------------------------------------------

    def settled(self, nodes: list[RedisServer] | None = None) -> bool:
        """Whether every node of ``nodes`` (default: the live ones) serves all 16384
        slots, all of them see the same topology with none of them failed, and every
        replica among them is linked to its master."""
        nodes = self.live_nodes() if nodes is None else nodes
        try:
            views = {}
            for node in nodes:
                with self._node_client(node) as client:
                    info = client.cluster("INFO")
                    if info.get("cluster_state") != "ok":
                        return False
                    if int(info["cluster_slots_ok"]) != REDIS_CLUSTER_HASH_SLOTS:
                        return False
                    # A node not yet met (or forgotten) by some other node: not settled.
                    if int(info["cluster_known_nodes"]) != len(self.nodes):
                        return False
                    view = parse_cluster_nodes(client.execute_command("CLUSTER NODES"))
                    me = next(n for n in view.values() if "myself" in n.flags)
                    replication = client.info("replication")
                    if (replication["role"] == "master") != me.is_master:
                        return False  # its view is ahead of (or behind) its replication
                    if not me.is_master and replication.get("master_link_status") != "up":
                        return False
                views[node.port] = view
        except redis.exceptions.RedisError:
            return False
        # Flags (myself, fail of a dead node) and ping times differ from node to node;
        # the roles and the slots must not.
        shapes = {
            frozenset((n.node_id, n.is_master, n.master_id, n.slots) for n in view.values())
            for view in views.values()
        }
        if len(shapes) != 1:
            return False
        ports = {node.port for node in nodes}
        return not any(
            n.port in ports and n.flags & _UNHEALTHY_FLAGS
            for view in views.values()
            for n in view.values()
        )

    def wait_settled(
        self, timeout_s: float, nodes: list[RedisServer] | None = None, what: str = ""
    ) -> None:
        wait_until(
            lambda: self.settled(nodes),
            timeout_s,
            interval_s=0.1,
            what=what or "the cluster to settle",
        )

    # -- faults -----------------------------------------------------------------------

    def kill_master_when_replicated(
        self, master: RedisServer, timeout_s: float = 10
    ) -> RedisServer:
        """SIGKILL ``master`` at an instant when each of its replicas holds every write
        it acked; returns it.

        Replication is asynchronous, so a master killed at a random instant may take its
        last acknowledged writes with it. As in ``SentinelGroup``, CLIENT PAUSE WRITE
        holds every client's next write (they wait, they are not refused) and stops the
        master's own pings to its replicas, so its replication offset stands still; the
        replicas catch up to it and the master dies with the held writes unexecuted:
        their clients' retries carry them to the new master.
        """
        replicas = self.replicas_of(master)
        if not replicas:
            raise RuntimeError(f"node {master.port} has no replica to fail over to")
        with master.client(decode_responses=True) as client:
            client.client_pause(30_000, all=False)
            try:
                target = client.info("replication")["master_repl_offset"]

                def caught_up() -> bool:
                    for replica in replicas:
                        with replica.client(decode_responses=True) as rc:
                            info = rc.info("replication")
                        if info.get("master_link_status") != "up":
                            return False
                        if info["slave_repl_offset"] < target:
                            return False
                    return True

                wait_until(
                    caught_up,
                    timeout_s,
                    interval_s=0.01,
                    what=f"the replicas of {master.port} to catch up",
                )
            except BaseException:
                client.client_unpause()  # the master lives on: do not leave its clients held
                raise
        master.kill()
        return master

    def wait_for_failover(self, old: RedisServer, timeout_s: float = 30) -> RedisServer:
        """Until a replica of ``old`` serves the slots ``old`` served and every other
        live node agrees, with all 16384 slots served; returns the new master."""
        former = self._own_line(old)
        if not former.slots:
            raise ValueError(f"node {old.port} served no slots: nothing to fail over")
        slot = former.slots[0][0]
        survivors = [node for node in self.live_nodes() if node is not old]

        def promoted() -> RedisServer | None:
            if not self.settled(survivors):
                return None
            new = self.master_of_slot(slot)
            return None if new is old else new

        new: RedisServer = wait_until(
            promoted, timeout_s, interval_s=0.1, what=f"a replica of {old.port} to take over"
        )
        return new


@contextlib.contextmanager
def redis_cluster(directory: Path, **kwargs: Any) -> Iterator[ClusterGroup]:
    group = ClusterGroup(directory=directory, **kwargs)
    try:
        yield group.start()
    finally:
        group.stop()
