"""A trial workload for the CPU twin: chat turns against the start under test, timed.

`frank trial run` runs it once per engine start with FRANK_TRIAL_BASE_URL set; it sends
TRIAL_REQUESTS (default 12) chat completions that share one long system prompt, one at a
time, and prints the median time per request in milliseconds as the JSON line the metric
`json:latency_ms` reads. Standard library only: it runs with any Python on the host.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import urllib.request


def call(base: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return dict(json.loads(resp.read()))


def main() -> None:
    base = os.environ["FRANK_TRIAL_BASE_URL"].rstrip("/")
    models = call(base, "/v1/models")["data"]
    model = models[0]["id"]  # type: ignore[index]
    system = "You are a careful assistant for a large code base. " * 20
    times = []
    for i in range(int(os.environ.get("TRIAL_REQUESTS", "12"))):
        body = {"model": model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": f"task {i}: summarise module {i % 4}"}]}
        start = time.perf_counter()
        out = call(base, "/v1/chat/completions", body)
        times.append((time.perf_counter() - start) * 1000)
        if not out.get("choices"):
            raise SystemExit(f"no choices in the reply to request {i}: {out}")
    print(json.dumps({"latency_ms": round(statistics.median(times), 3), "requests": len(times)}))


if __name__ == "__main__":
    main()
