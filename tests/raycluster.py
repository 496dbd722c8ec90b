"""A real Ray cluster on this machine for the Ray engine's tests: a head node plus more nodes.

Each node is a ``ray start --block`` process that this helper owns: it runs
in the foreground, its Ray processes (GCS, raylet, workers, agents) are its
descendants, and SIGTERM to it stops them all (Ray ties them to it). Only
those processes are ever signalled -- never ``ray stop`` or a search by
name -- so other Ray users on the machine are left alone. Each cluster has
its own temp folder. Token authentication is off (``RAY_AUTH_MODE=disabled``)
for these short-lived test clusters: a driver in the test process could not
switch it on after ``import ray`` (Ray reads the mode once per process).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
READY = "block forever"  # what `ray start --block` prints once its node is up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayCluster:
    def __init__(self) -> None:
        # Short: Ray's unix socket paths live under it (108-byte limit).
        self.temp = Path(tempfile.mkdtemp(prefix="rayt", dir="/tmp"))
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen] = []  # [head, other nodes...]

    def _start(self, args: list[str], name: str, timeout: float = 90) -> subprocess.Popen:
        log = self.temp / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                                     *args], stdout=f, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while READY not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                self._stop(proc)
                raise RuntimeError(f"ray start ({name}) failed:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        return proc

    def start(self, cpus: int = 1) -> RayCluster:
        self.nodes.append(self._start(["--head", f"--port={self.port}", f"--num-cpus={cpus}",
                                       "--include-dashboard=false", f"--temp-dir={self.temp}"], "head"))
        return self

    def scale(self, nodes: int, cpus: int = 1) -> None:
        """Add or stop non-head nodes until the cluster has ``nodes`` nodes, and wait until Ray agrees."""
        while len(self.nodes) > nodes:
            self._stop(self.nodes.pop())
        while len(self.nodes) < nodes:
            k = len(self.nodes)
            self.nodes.append(self._start([f"--address={self.address}", f"--num-cpus={cpus}",
                                           f"--temp-dir={self.temp}", "--dashboard-agent-listen-port=0"], f"node{k}"))
        self.wait_for_nodes(nodes)

    def wait_for_nodes(self, nodes: int, timeout: float = 90) -> None:
        """Wait until ``nodes`` nodes are alive *and* the scheduler spreads tasks over all of them.

        A node shows as alive in the GCS before the other raylets have its
        resources, and until they do every task queues on the head node.
        So the probe runs ``nodes`` one-CPU tasks at once, each holding its
        CPU for a moment, until they report ``nodes`` different node IDs.
        """
        script = ("import ray, time\nray.init(address=%r, logging_level='ERROR', log_to_driver=False)\n"
                  "nodes, timeout = %d, %r\n"
                  "@ray.remote(num_cpus=1)\n"
                  "def where():\n"
                  "    time.sleep(0.5)\n"
                  "    return ray.get_runtime_context().get_node_id()\n"
                  "t = time.monotonic()\n"
                  "while sum(n['Alive'] for n in ray.nodes()) != nodes and time.monotonic() - t < timeout:\n"
                  "    time.sleep(0.2)\n"
                  "seen = set()\n"
                  "while len(seen) < nodes and time.monotonic() - t < timeout:\n"
                  "    seen = set(ray.get([where.remote() for _ in range(nodes)]))\n"
                  "print(sum(n['Alive'] for n in ray.nodes()), len(seen))\n") % (self.address, nodes, timeout)
        out = subprocess.run([sys.executable, "-c", script], env=self.env, capture_output=True, text=True,
                             timeout=timeout + 60)
        if out.stdout.strip() != f"{nodes} {nodes}":
            raise RuntimeError(f"the cluster did not reach {nodes} nodes that run tasks (alive, used): "
                               f"{out.stdout} {out.stderr[-2000:]}")

    def processes(self) -> list[psutil.Process]:
        """Every process of the cluster (the `ray start` processes and their descendants)."""
        procs = []
        for node in self.nodes:
            try:
                p = psutil.Process(node.pid)
                procs += [p, *p.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return procs

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        try:
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        _gone, alive = psutil.wait_procs(family, timeout=10)
        for p in alive:  # should not happen: Ray ties its processes to `ray start --block`
            p.kill()

    def stop(self) -> None:
        while self.nodes:
            self._stop(self.nodes.pop())
        shutil.rmtree(self.temp, ignore_errors=True)
