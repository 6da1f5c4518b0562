"""The workload side of one trial start in a Kubernetes Job (standard library only).

It runs in the Job's pod next to the engine (a sidecar of the same pod, reached on
127.0.0.1) and does what ``frank trial run`` does around a workload: wait for ``/health``,
read ``/metrics``, run the workload command, read ``/metrics`` again. It computes nothing:
it prints one line, ``frank-trial-result <JSON>``, with the raw samples of the series the
sealed metric reads, the workload's output and the times, and ``frank trial record NAME
LOGS`` evaluates the sealed metric from it with frank's own code (the same rules as a local
run). The source of this file is the container's ``python3 -c`` program, as rendered.

Settings come from the environment the Job sets: FRANK_TRIAL_BASE_URL, FRANK_TRIAL_WORKLOAD,
FRANK_TRIAL_SERIES (comma-separated), FRANK_TRIAL_READY_TIMEOUT, FRANK_TRIAL_WORKLOAD_TIMEOUT
and the start's FRANK_TRIAL_* fields that the result line repeats.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

MARK = "frank-trial-result "
FIELDS = ("FRANK_TRIAL_NAME", "FRANK_TRIAL_DIGEST", "FRANK_TRIAL_START", "FRANK_TRIAL_BLOCK",
          "FRANK_TRIAL_ARM", "FRANK_TRIAL_STACK", "FRANK_TRIAL_LOCK_DIGEST", "FRANK_TRIAL_IMAGE")
RESTART_SERIES = "process_start_time_seconds"
MAX_OUTPUT = 1 << 20  # the workload's stdout kept (its tail), bytes


def now() -> str:
    """UTC now, as frank's results write it."""
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    return stamp.replace("+00:00", "Z")


def get(url: str, timeout: float) -> str | None:
    """The body of a GET, or None when the engine does not answer 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace") if resp.status == 200 else None
    except OSError:
        return None


def samples(text: str, series: set[str]) -> str:
    """The Prometheus sample lines of the named series (the rest is not needed)."""
    keep: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)", line)
        if m and m.group(1) in series:
            keep.append(line)
    return "\n".join(keep)


def main() -> int:
    env = os.environ
    base = env["FRANK_TRIAL_BASE_URL"]
    # the engine's own start time, read before and after: a restart must not go unseen
    series = {s for s in env.get("FRANK_TRIAL_SERIES", "").split(",") if s}
    series.add(RESTART_SERIES)
    out: dict[str, object] = {k[len("FRANK_TRIAL_"):].lower(): env.get(k, "") for k in FIELDS}
    out["started"] = now()
    deadline = time.monotonic() + float(env.get("FRANK_TRIAL_READY_TIMEOUT", "1800"))
    while get(base + "/health", 5) is None:
        if time.monotonic() > deadline:
            out.update(status="crash", error="engine not ready in time", finished=now())
            print(MARK + json.dumps(out, sort_keys=True), flush=True)
            return 1
        time.sleep(1)
    out["ready"] = now()
    before = samples(get(base + "/metrics", 30) or "", series)
    try:
        work = subprocess.run(["/bin/sh", "-c", env["FRANK_TRIAL_WORKLOAD"]],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=float(env.get("FRANK_TRIAL_WORKLOAD_TIMEOUT", "3600")))
    except subprocess.TimeoutExpired:
        out.update(status="crash", error="workload ran past its timeout", finished=now())
        print(MARK + json.dumps(out, sort_keys=True), flush=True)
        return 1
    sys.stderr.write(work.stderr)
    after = samples(get(base + "/metrics", 30) or "", series)
    err = (work.stderr.strip().splitlines() or ["(no stderr)"])[-1][:300]
    out.update(status="ok" if work.returncode == 0 else "crash", rc=work.returncode,
               error=None if work.returncode == 0 else
               f"workload exited with code {work.returncode}: {err}",
               stdout=work.stdout[-MAX_OUTPUT:], metrics_before=before, metrics_after=after,
               finished=now())
    print(MARK + json.dumps(out, sort_keys=True), flush=True)
    return 0 if work.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
