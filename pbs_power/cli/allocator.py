"""``pbs-power allocator serve|request``: the resource allocator server and its client.

Exit codes: 0 ok; 1 the server could not run, could not be reached, or
answered with an error; 2 bad usage or config.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Optional

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_parser(subparsers: Any) -> None:
    """Add ``allocator`` and its ``serve`` and ``request`` subcommands."""
    parser = subparsers.add_parser(
        "allocator", help="power-aware resource allocator server (WebSocket) and client",
        description="Pick a cluster, node and GPUs for allocation requests, from the "
                    "topology and live power state pbs_power holds.")
    actions = parser.add_subparsers(dest="allocator_command", metavar="ACTION", required=True)
    _add_serve(actions)
    _add_request(actions)


def _add_serve(actions: Any) -> None:
    p = actions.add_parser("serve", help="run the WebSocket server until SIGINT/SIGTERM",
                           description="Serve allocation requests on ws://HOST:PORT. Clusters "
                                       "come from --config, else --state-dir's topology.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (8765; 0 picks a free one)")
    p.add_argument("--config", metavar="FILE", help="allocator config (JSON)")
    p.add_argument("--policy-dir", metavar="DIR", help="directory of site policies (NAME.py)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="the cluster's state directory when --config names no clusters "
                        "(default: $PBS_POWER_STATE_DIR, else /var/spool/pbs_power)")
    p.add_argument("--hook-config", metavar="FILE",
                   help="hook config whose power backend reports node power states")
    p.add_argument("--default-policy", metavar="NAME", help="policy of an empty policy_rule_uri")
    p.add_argument("--eval-timeout", type=_positive, metavar="S",
                   help="seconds before a request gets a timeout error (30)")
    p.add_argument("--max-workers", type=int, metavar="N",
                   help="policy worker processes (8), started as needed")
    p.add_argument("--lease-seconds", type=_positive, metavar="S",
                   help="seconds an answer holds its nodes for the job to start (120)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="open connections; more are closed with code 1013 (1000)")
    p.add_argument("--idle-timeout", type=_positive, metavar="S",
                   help="seconds a connection may wait between messages (300)")
    p.add_argument("--admin-socket", metavar="PATH",
                   help="Unix socket (mode 0600) whose clients may send management messages")
    p.add_argument("--admin-token-file", metavar="FILE",
                   help="file (mode 0600) holding a token that allows management over TCP")
    p.add_argument("--refresh", type=float, metavar="S",
                   help="seconds live cluster state is reused (5)")
    p.add_argument("--cluster-registry-url", metavar="URL",
                   help="HTTP cluster registry (default: $CLUSTER_SERVICE_URL)")
    p.add_argument("--metrics-url", metavar="URL",
                   help="HTTP cluster metrics service (default: $GLOBAL_CLUSTER_METRICS_URL)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run_serve)


def _add_request(actions: Any) -> None:
    p = actions.add_parser("request", help="send a request file to a server, print the answer",
                           description="Send FILE (JSON; - reads stdin) and print the answer.")
    p.add_argument("file", metavar="FILE.json")
    p.add_argument("--url", default="ws://127.0.0.1:8765", help="server (ws://127.0.0.1:8765)")
    p.add_argument("--timeout", type=_positive, default=120.0, metavar="S",
                   help="seconds to wait for the answer (120)")
    p.set_defaults(func=run_request)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of seconds, got %r" % text) from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0, got %r" % text)
    return value


def build_config(args: argparse.Namespace) -> Any:
    """The effective AllocatorConfig: file, then options; AllocatorConfigError if unusable."""
    from pbs_power.allocator.config import (AllocatorConfig, AllocatorConfigError,
                                            ClusterSource, from_environment,
                                            load_allocator_config)
    config = load_allocator_config(args.config) if args.config else AllocatorConfig()
    clusters = None
    if args.state_dir or args.hook_config:
        if config.clusters:
            raise AllocatorConfigError("--state-dir/--hook-config and the config's clusters "
                                       "exclude each other")
        state_dir = args.state_dir or config.cluster_sources()[0].state_dir
        hook = os.path.abspath(args.hook_config) if args.hook_config else None
        clusters = [ClusterSource(os.path.abspath(state_dir), hook_config=hook)]
    if args.max_workers is not None and not 1 <= args.max_workers <= 256:
        raise AllocatorConfigError("--max-workers must be from 1 to 256")
    if args.refresh is not None and args.refresh < 0:
        raise AllocatorConfigError("--refresh must be >= 0")
    if args.max_connections is not None and args.max_connections < 1:
        raise AllocatorConfigError("--max-connections must be at least 1")
    paths = {k: os.path.abspath(v) for k, v in (("admin_socket", args.admin_socket),
                                                 ("admin_token_file", args.admin_token_file))
             if v}
    return from_environment(config.with_overrides(
        clusters=clusters, policy_dir=args.policy_dir, default_policy=args.default_policy,
        eval_timeout_seconds=args.eval_timeout, max_workers=args.max_workers,
        refresh_seconds=args.refresh, cluster_registry_url=args.cluster_registry_url,
        metrics_url=args.metrics_url, lease_seconds=args.lease_seconds,
        max_connections=args.max_connections, idle_timeout_seconds=args.idle_timeout, **paths))


def run_serve(args: argparse.Namespace) -> int:
    """Start the server; prints one line when it listens."""
    from pbs_power.allocator.config import AllocatorConfigError
    from pbs_power.allocator.server import AllocatorServer, serve, setup_logging
    from pbs_power.allocator.service import AllocatorService
    setup_logging(args.log_level)
    try:
        service = AllocatorService(build_config(args))
    except AllocatorConfigError as exc:
        print("pbs-power allocator serve: error: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    if args.host not in LOOPBACK:
        print("pbs-power allocator serve: warning: listening on %s: allocation requests are "
              "not authenticated; firewall the port" % args.host, file=sys.stderr)
    try:
        server = AllocatorServer(service, args.host, args.port)
    except AllocatorConfigError as exc:
        print("pbs-power allocator serve: error: %s" % exc, file=sys.stderr)
        return EXIT_INVALID

    def announce(port: int) -> None:
        print("pbs-power allocator: listening on ws://%s:%d (clusters: %s; policies: %s)"
              % (args.host, port, ", ".join(service.clusters),
                 ", ".join(service.registry.names())), flush=True)
    try:
        asyncio.run(serve(server, announce))
    except OSError as exc:
        print("pbs-power allocator serve: error: cannot listen on %s:%d: %s"
              % (args.host, args.port, exc.strerror or exc), file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def run_request(args: argparse.Namespace) -> int:
    """Send the file, print the answer; exit 1 when the answer is an error."""
    from pbs_power.allocator.client import request_once
    text = _read(args.file)
    if text is None:
        return EXIT_INVALID
    try:
        answer = request_once(args.url, text, args.timeout)
    except Exception as exc:  # refused, closed, timed out, bad URL: all say why and exit 1
        print("pbs-power allocator request: error: %s: %s: %s"
              % (args.url, type(exc).__name__, exc), file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(answer, indent=2))
    if not answer.get("ok"):
        error = answer.get("error", {})
        print("pbs-power allocator request: %s: %s" % (error.get("code"), error.get("message")),
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _read(path: str) -> Optional[str]:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
        json.loads(text)
        return text
    except OSError as exc:
        print("pbs-power allocator request: error: %s: %s" % (path, exc.strerror or exc),
              file=sys.stderr)
    except ValueError as exc:
        print("pbs-power allocator request: error: %s: not valid JSON (%s)" % (path, exc),
              file=sys.stderr)
    return None
