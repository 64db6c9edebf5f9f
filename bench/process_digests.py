"""The same file scored in many fresh processes: how many distinct digest lists come back.

    python bench/process_digests.py --model DIR_OR_NAME [--pack spam] [--input examples/messages.jsonl]
                                    [--runs 50] [--burners 2] [--threads 2] [--keep-stderr DIR]

Each run is ``spinf-stream score`` in a new process (``OMP_NUM_THREADS=--threads``), while
``--burners`` busy-loop processes oversubscribe the CPUs. Prints each distinct list of digests
(first 8 hex digits per record) with its count, and the load average. A second list is a
cross-process bit-stability failure: ``docs/invariance.md``, "Open". With ``--keep-stderr`` the
``--log-level DEBUG`` stderr of every run whose list differs from the first is kept there.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]


def one_run(args: argparse.Namespace) -> tuple[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "spinf_stream.cli", "score", "--pack", args.pack, "--model", args.model,
         "--input", args.input, "--device", "cpu", "--no-progress", "--log-level", "DEBUG"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    if r.returncode != 0:
        return f"exit {r.returncode}", r.stderr
    return " ".join(orjson.loads(line)["digest"][7:15] for line in r.stdout.splitlines()), r.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--pack", default="spam")
    ap.add_argument("--input", default=str(REPO / "examples" / "messages.jsonl"))
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-stderr", type=Path, default=None)
    args = ap.parse_args(argv)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    seen: collections.Counter[str] = collections.Counter()
    first = None
    try:
        for i in range(args.runs):
            digests, stderr = one_run(args)
            seen[digests] += 1
            first = first or digests
            if digests != first and args.keep_stderr is not None:
                args.keep_stderr.mkdir(parents=True, exist_ok=True)
                (args.keep_stderr / f"run{i}.stderr").write_text(stderr)
    finally:
        for b in burners:
            b.kill()
    print(f"{args.runs} runs, {args.burners} burners, OMP_NUM_THREADS={args.threads}, load average {os.getloadavg()}")
    for digests, n in seen.most_common():
        print(f"{n:5d}  {digests}")
    return 0 if len(seen) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
