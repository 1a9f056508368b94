"""How long validating a hook config takes as node_power_overrides grow.

Writes configs with N one-host overrides (a state_dir of their own, so the
checked-config memo starts empty), then times ``load_config`` twice per size:
the first load runs the full check (JSON Schema and our rules), the second is
served by the memo (our rules only). Prints JSON, including seconds per
100,000 overrides, to show that the cost grows linearly.

    python benchmarks/config_validate.py [--sizes 20000,100000,200000]
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pbs_power.config.hook_config import load_config  # noqa: E402


def config_with(n: int, state_dir: str) -> dict:
    """A config with ``n`` overrides, one host each, alternating plain names and ranges."""
    overrides = [{"nodes": "n%07d" % i if i % 2 else "r%07d[1-2]" % i, "idle_watts": 300}
                 for i in range(n)]
    return {"state_dir": state_dir,
            "node_power": {"off_watts": 10, "sleep_watts": 90, "idle_watts": 250,
                           "busy_watts": 450},
            "node_power_overrides": overrides}


def timed(path: str) -> float:
    began = time.perf_counter()
    load_config(path)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,100000,200000",
                        help="comma-separated override counts (default 20000,100000,200000)")
    args = parser.parse_args()
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            path, state = Path(tmp) / "config.json", Path(tmp) / "state"
            state.mkdir()   # where the memo of checked configs is kept
            path.write_text(json.dumps(config_with(n, str(state))))
            full, memo = timed(str(path)), timed(str(path))
            rows.append({"overrides": n, "megabytes": round(path.stat().st_size / 1e6, 1),
                         "full_check_s": round(full, 2), "memo_s": round(memo, 2),
                         "full_check_s_per_100k": round(full * 100000 / n, 2)})
    print(json.dumps({"runs": rows}))


if __name__ == "__main__":
    main()
