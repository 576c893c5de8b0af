"""FAKE cluster network for a program the fake API server runs as a container's command (an init
container's, today): `python k8s_fake_net.py NETWORK.json PROGRAM ARGS...` runs PROGRAM as
`__main__` with the pod network the fake keeps in NETWORK.json (re-read at every lookup, as the
fake API server rewrites it while pods come and go):

- `names`: every DNS name of the job's pods. A name resolves only once its pod has an address
  (Kubernetes docs, "DNS for Services and Pods": a pod with `hostname`/`subdomain` gets an A record
  when a headless Service named like the subdomain selects it; `publishNotReadyAddresses` publishes
  it before the pod is ready); until then `getaddrinfo` fails as a missing record does (EAI_NONAME).
- `hosts`: name -> address (always 127.0.0.1 here).
- `ports`: "name:port" -> the local port a container really listens on: the files of the folder
  NETWORK.ports/ (one per listener, named `name:port`, holding the local port; written by the program
  that listens, tests/k8s_fake_torchrun.py for the head's rendezvous, and removed when it ends or its
  pod goes); any other port of a pod that has an address refuses the connection.

Other names resolve as usual. With GPUCLUSTER_FAKE_FAST_CLOCK set the program's sleeps are capped at
50 ms (the fake's clock runs fast: a polling loop polls more often, its deadlines stay the same).
"""

from __future__ import annotations

import json
import runpy
import socket
import os
import sys
import time

_NETWORK = sys.argv[1]
_PORTS = os.path.splitext(_NETWORK)[0] + ".ports"
_getaddrinfo, _create_connection = socket.getaddrinfo, socket.create_connection


def _load() -> dict:
    try:
        with open(_NETWORK) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def getaddrinfo(host, port, *args, **kw):
    net = _load()
    if host in net.get("names", ()):
        if host not in net.get("hosts", {}):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        host = net["hosts"][host]
    return _getaddrinfo(host, port, *args, **kw)


def create_connection(address, *args, **kw):
    host, port = address[:2]
    net = _load()
    if host in net.get("names", ()):
        getaddrinfo(host, port)  # no record yet: gaierror
        local = net.get("ports", {}).get(f"{host}:{port}")
        try:
            with open(os.path.join(_PORTS, f"{host}:{port}")) as f:
                local = int(f.read())
        except (OSError, ValueError):
            pass
        if local is None:
            raise ConnectionRefusedError(111, "Connection refused")
        address = ("127.0.0.1", int(local))
    return _create_connection(address, *args, **kw)


socket.getaddrinfo, socket.create_connection = getaddrinfo, create_connection
if os.environ.get("GPUCLUSTER_FAKE_FAST_CLOCK"):
    _sleep = time.sleep
    time.sleep = lambda seconds: _sleep(min(seconds, 0.05))
if sys.argv[2] == "-c":  # python -c CODE ARGS...
    code, sys.argv = sys.argv[3], ["-c", *sys.argv[4:]]
    sys.path[0] = ""  # as `python -c` sets it
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
elif sys.argv[2] == "-m":  # python -m MODULE ARGS...
    module, sys.argv = sys.argv[3], [sys.argv[3], *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python SCRIPT` sets it
    runpy.run_path(sys.argv[0], run_name="__main__")
