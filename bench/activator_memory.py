"""The activator's memory with its hold full, against an idle activator in the same run (issue 31).

Starts ``tidal-gateway`` as the operator runs it in front of a service at zero (``activator``,
no replica, ``holdTimeoutSeconds`` 120, every other setting at its default: ``maxHeldRequests``
1,000, ``maxHeldBytes`` 256 MiB), then for each kind of body:

* ``binary``: 8 MiB bodies (a small JSON header and one binary tensor), the usual shape of a
  large request;
* ``json``: 8 MiB JSON bodies (one FP32 tensor as a JSON list), the worst case: the hold parses
  the JSON header of each request it keeps, so the decoded list exists for a moment;
* ``small``: 1,100 small JSON requests at once: exactly 1,000 held, the rest refused at once.

it sends requests until the hold refuses one (maxHeldBytes or maxHeldRequests), and reads the
process's RSS (``VmRSS``) and peak (``VmHWM``) from ``/proc``: idle, with the hold full, and
the ratio of the two. A fresh process per kind, so each peak is its own. It also times a held
request's arrival at the operator's long-poll (``GET /v2/tidal/held?seen=0&wait=25``).

    .venv/bin/python bench/activator_memory.py [--mib 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import aiohttp

MIB = 2**20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def start() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = {"activator": True, "models": ["m"], "holdTimeoutSeconds": 120}
    env = {
        **os.environ,
        "TIDAL_HOST": "127.0.0.1",
        "TIDAL_PORT": str(port),
        "TIDAL_GATEWAY_CONFIG_JSON": json.dumps(config),
        "TIDAL_LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen([sys.executable, "-m", "tidal.gateway"], env=env)
    return process, f"http://127.0.0.1:{port}"


async def wait_ready(url: str, session: aiohttp.ClientSession) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.get(f"{url}/v2/health/ready") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the gateway did not become ready")
        await asyncio.sleep(0.05)


def body(kind: str, mib: int) -> tuple[bytes, dict[str, str]]:
    if kind == "small":
        tensor = {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}
        return json.dumps({"inputs": [tensor]}).encode(), {}
    count = mib * MIB // 4
    if kind == "binary":
        tensor = {
            "name": "x",
            "datatype": "FP32",
            "shape": [1, count],
            "parameters": {"binary_data_size": count * 4},
        }
        header = json.dumps({"inputs": [tensor]}).encode()
        headers = {"Inference-Header-Content-Length": str(len(header))}
        return header + os.urandom(count * 4), headers
    text = b"[" + b",".join([b"0.123456"] * (mib * MIB // 9)) + b"]"
    prefix = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, %d], "data": ' % (
        mib * MIB // 9
    )
    return prefix + text + b"}]}", {}


async def held(url: str, session: aiohttp.ClientSession) -> int:
    async with session.get(f"{url}/v2/tidal/held") as response:
        return int((await response.json())["held"])


async def one_kind(kind: str, mib: int) -> dict[str, Any]:
    process, url = start()
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await wait_ready(url, session)
            # Warm up: a request held and expired once (imports, first-use caches).
            small, _ = body("small", 0)
            short = json.dumps({**json.loads(small), "parameters": {"timeout": 1000}}).encode()
            async with session.post(f"{url}/v2/models/m/infer", data=short) as response:
                await response.read()
            idle, _ = memory(process.pid)
            # The operator's long-poll, parked, answered by one held request (held 1 s).
            poll = asyncio.create_task(
                session.get(f"{url}/v2/tidal/held", params={"seen": "0", "wait": "25"})
            )
            answered_at: list[float] = []
            poll.add_done_callback(lambda _: answered_at.append(time.monotonic()))
            await asyncio.sleep(0.5)  # parked before the request is sent
            probe = json.dumps({**json.loads(small), "parameters": {"timeout": 10**6}}).encode()
            probe_sent = time.monotonic()
            async with session.post(f"{url}/v2/models/m/infer", data=probe) as response:
                await response.read()
            response = await poll
            poll_answer = await response.json()
            poll_s = answered_at[0] - probe_sent
            if kind == "probe":  # the long-poll alone, again (the first is above)
                return {"kind": kind, "long_poll_ms": poll_s * 1000}
            data, headers = body(kind, mib)
            answers: list[asyncio.Task[tuple[int, float]]] = []

            async def send() -> tuple[int, float]:
                sent = time.monotonic()
                async with session.post(
                    f"{url}/v2/models/m/infer", data=data, headers=headers
                ) as response:
                    await response.read()
                    return response.status, time.monotonic() - sent

            if kind == "small":
                answers = [asyncio.create_task(send()) for _ in range(1100)]
                while True:
                    done = [t.result() for t in answers if t.done()]
                    if len(done) >= 100 and await held(url, session) == 1000:
                        break
                    await asyncio.sleep(0.05)
            else:
                while True:  # one at a time until the hold refuses one
                    task = asyncio.create_task(send())
                    answers.append(task)
                    before = len([t for t in answers if t.done()])
                    while not task.done():  # until it is held, or answered (refused)
                        if await held(url, session) >= len(answers) - before:
                            break
                        await asyncio.sleep(0.01)
                    if task.done():
                        break
            full, peak = memory(process.pid)
            holding = await held(url, session)
            refused = [t.result() for t in answers if t.done()]
            for task in answers:
                task.cancel()
            return {
                "kind": kind,
                "held": holding,
                "refused": len(refused),
                "refused_in_s": max((s for _, s in refused), default=0.0),
                "refused_codes": sorted({c for c, _ in refused}),
                "body_mib": len(data) / MIB,
                "idle_mib": idle / MIB,
                "full_mib": full / MIB,
                "peak_mib": peak / MIB,
                "ratio": full / idle,
                "long_poll_ms": poll_s * 1000,
                "long_poll_held": poll_answer["held"],
            }
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=8, help="size of each large body")
    parser.add_argument(
        "--probes",
        type=int,
        default=0,
        help="only time a held request's way to the long-poll, this many times (a fresh "
        "process each); run it with PYTHONPATH set to another checkout to compare",
    )
    args = parser.parse_args()
    if args.probes:
        times = sorted(
            asyncio.run(one_kind("probe", 0))["long_poll_ms"] for _ in range(args.probes)
        )
        print(
            f"held request -> long-poll: median {times[len(times) // 2]:.1f} ms, min "
            f"{times[0]:.1f}, max {times[-1]:.1f} ({args.probes} processes)"
        )
        return
    print(f"activator memory: maxHeldBytes 256 MiB, maxHeldRequests 1000, bodies {args.mib} MiB")
    for kind in ("small", "binary", "json"):
        r = asyncio.run(one_kind(kind, args.mib))
        print(
            f"{r['kind']:>6}: held {r['held']} x {r['body_mib']:.3f} MiB, refused "
            f"{r['refused']} (codes {r['refused_codes']}, slowest {r['refused_in_s'] * 1000:.0f}"
            f" ms); RSS idle {r['idle_mib']:.0f} MiB, hold full {r['full_mib']:.0f} MiB "
            f"(x{r['ratio']:.2f}), peak {r['peak_mib']:.0f} MiB; first hold reached the "
            f"long-poll in {r['long_poll_ms']:.1f} ms (held={r['long_poll_held']})"
        )


if __name__ == "__main__":
    main()
