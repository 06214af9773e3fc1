"""``tidal-sandbox``: build, start, stop the local Kubernetes sandbox, or run the demo."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from .binaries import ensure_binaries
from .cluster import Sandbox, SandboxConfig


def _config(args: argparse.Namespace, state_dir: Path | None) -> SandboxConfig:
    return SandboxConfig(
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        fake_nodes=args.fake_nodes,
        real_node=args.real_node,
        real_node_gpus=args.gpus,
        state_dir=state_dir,
        keep_state=state_dir is not None,
    )


def cmd_up(args: argparse.Namespace) -> int:
    state = Path(args.state_dir).resolve()
    if (state / "up.pid").exists():
        print(f"a sandbox seems to run already in {state} (remove up.pid if not)", file=sys.stderr)
        return 1
    sb = Sandbox(_config(args, state)).start()
    (state / "up.pid").write_text(str(os.getpid()))
    print(f"sandbox up in {sb.started_seconds:.1f}s")
    print(json.dumps(sb.describe(), indent=2))
    print(f"\n  export KUBECONFIG={sb.kubeconfig}")
    print(f"  {sb.binaries.kubectl if sb.binaries else 'kubectl'} get nodes")
    print(f"\nstop it with:  Ctrl-C here, or  tidal-sandbox down --state-dir {state}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    print("stopping the sandbox…", flush=True)
    sb.stop()
    (state / "up.pid").unlink(missing_ok=True)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    pid_file = Path(args.state_dir) / "up.pid"
    if not pid_file.exists():
        print(f"no running sandbox recorded in {args.state_dir}", file=sys.stderr)
        return 1
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    print("asked the sandbox to stop")
    return 0


def cmd_build(_args: argparse.Namespace) -> int:
    bins = ensure_binaries()
    for name, path in vars(bins).items():
        print(f"{name:26} {path}")
    return 0


def cmd_images(_args: argparse.Namespace) -> int:
    from .images import build_project_images
    from .realnode import ensure_node_binaries

    built = build_project_images(ensure_node_binaries().bin)
    for key, image in vars(built).items():
        how = f"built in {image.seconds:.0f} s" if image.seconds else "reused"
        print(f"{key:12} {image.name:55} {how:16} {image.archive}")
    return 0


def registry_arg(value: str) -> str:
    """``--registry``: refused by argparse, naming the argument, unless HOST[:PORT][/PATH]."""
    from .release import Target

    try:
        Target(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def cmd_release(args: argparse.Namespace) -> int:
    from .release import Target, run_release

    plain = True if args.plain_http else None
    target = Target(args.registry, plain_http=plain)  # the version: tidal.common.release
    for ref, digest in run_release(target, chart=not args.no_chart).items():
        print(f"{ref:70} {digest}")
    print(f"\nhelm install tidal {target.chart} --version {target.version}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(keep=args.keep, real_node=args.real_node)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tidal-sandbox", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a sandbox and keep it running in the foreground")
    up.add_argument("--state-dir", default=str(Path.home() / ".cache" / "tidal" / "sandbox-state"))
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--gpus", type=int, default=2, help="nvidia.com/gpu per node")
    up.add_argument("--fake-nodes", type=int, default=0)
    up.add_argument(
        "--real-node",
        action="store_true",
        help="a real node (kubelet, containerd, kube-proxy, CoreDNS) with the project's images; "
        "use --nodes 0 for it alone",
    )
    up.set_defaults(fn=cmd_up)
    down = sub.add_parser("down", help="stop the sandbox started by `up`")
    down.add_argument(
        "--state-dir", default=str(Path.home() / ".cache" / "tidal" / "sandbox-state")
    )
    down.set_defaults(fn=cmd_down)
    build = sub.add_parser("build", help="build or locate the control-plane binaries")
    build.set_defaults(fn=cmd_build)
    images = sub.add_parser("images", help="build (or reuse) the project's container images")
    images.set_defaults(fn=cmd_images)
    rel = sub.add_parser("release", help="build the images, push them and the chart to a registry")
    rel.add_argument(
        "--registry", required=True, type=registry_arg, help="HOST[:PORT][/PATH], e.g. ghcr.io/you"
    )
    rel.add_argument("--plain-http", action="store_true", help="HTTP (default: loopback only)")
    rel.add_argument("--no-chart", action="store_true", help="push the images only")
    rel.set_defaults(fn=cmd_release)
    demo = sub.add_parser("demo", help="run the demo on a fresh sandbox")
    demo.add_argument("--keep", action="store_true", help="keep the sandbox running afterwards")
    demo.add_argument(
        "--real-node",
        action="store_true",
        help="on the real node (kubelet, containerd; needs root, nftables and the images, "
        "which `make images` builds) instead of the node agent",
    )
    demo.set_defaults(fn=cmd_demo)
    args = p.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
