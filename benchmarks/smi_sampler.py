"""nvidia-smi's readings of the GPU: its clocks, power and driver once (query), and its SM clock
and power over a benchmark run, sampled by `nvidia-smi --loop-ms` in a thread (SmiSampler).

Why: the H200 runs under a 700 W limit, so a compute-bound kernel runs at whatever SM clock its
power draw allows (p10 against median of one row's replays: 238 against 268 µs at B128 kv4096
H128, 2026-12-02), and the matmul ceiling measured at the start of the run may have had another.
The benchmark asks for the median clock inside each timed window and puts the matmul at that
clock (a sustained matmul's TFLOP/s per GHz: tensor work per clock is fixed), next to the plain
% of roofline.

    query(uuid)                           # {"clocks.sm": "1980 MHz", ...}; {} without nvidia-smi
    sampler = SmiSampler.start(uuid)      # None when nvidia-smi is not there
    t0 = time.monotonic(); ...timed work...; t1 = time.monotonic()
    sampler.window(t0, t1)                # {"sm_mhz": 1755.0, "power_w": 690.2, "clock_samples": 9}
    sampler.close()

SmiSampler.start(uuid, reasons=True) also records the active clock event reasons (a bitmask as
nvidia-smi prints it, e.g. 0x0000000000000004: SW power cap): sampler.reasons_in(t0, t1).
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from typing import Optional

# nvidia-smi keeps up with 20 ms on the H200 (147 lines in 3 s, Session 28): a row's ~0.27 s
# window of replays gets ~13 samples, the 1.5 s sustained matmul ~75 (15 at 100 ms).
PERIOD_MS = 20


def commands(cmd: list[str], uuid: Optional[str]) -> list[list[str]]:
    """cmd for the GPU with this UUID (torch gives it without the GPU- prefix), then cmd as given
    (the default GPU) in case nvidia-smi does not know that id; cmd alone without a UUID."""
    if not uuid:
        return [cmd]
    gpu = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
    return [cmd[:1] + [f"--id={gpu}"] + cmd[1:], cmd]


QUERY_FIELDS = ("name", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.draw",
                "power.limit", "temperature.gpu", "driver_version")


def query(uuid: Optional[str]) -> dict:
    """Clocks, power and driver of this GPU ({} when nvidia-smi is not there)."""
    cmd = ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader"]
    for attempt in commands(cmd, uuid):
        try:
            out = subprocess.run(attempt, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return {}
        if out.returncode == 0 and out.stdout.strip():
            values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
            return dict(zip(QUERY_FIELDS, values))
    return {}


def parse_line(line: str) -> Optional[tuple[float, float]]:
    """'1755, 690.21' (clocks.sm MHz, power.draw W; csv, noheader, nounits) -> (1755.0, 690.21)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 2:
        return None
    try:
        return float(parts[0]), float(parts[1])
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


# The board's power: the instantaneous reading where the driver has it. On the H200 (driver
# 580.159) plain power.draw trails by about a second: a 0.5 s row at the 700 W cap read 257-300 W
# through it and 740 W through power.draw.instant (Session 52; both are refreshed every ~100 ms,
# so a row of 0.15 s gets one or two readings of either).
POWER_FIELDS = ("power.draw.instant", "power.draw")
# The field with the reasons the clock is held down: its current name, then the older drivers' one.
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def window_stats(samples: list[tuple[float, float, float]], t0: float, t1: float) -> dict:
    """Medians of the (time, MHz, W) samples taken in [t0, t1]; {} when there are none."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return {}
    return {"sm_mhz": statistics.median(s[1] for s in inside),
            "power_w": statistics.median(s[2] for s in inside),
            "clock_samples": len(inside)}


class SmiSampler:
    """One `nvidia-smi` process printing clocks.sm and the power (POWER_FIELDS' first known; with
    `reasons` also the clock event reasons) every PERIOD_MS; a daemon thread stamps each line
    with time.monotonic() as it arrives."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.samples: list[tuple[float, float, float]] = []
        self.reasons: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, uuid: Optional[str], reasons: bool = False) -> Optional["SmiSampler"]:
        """A running sampler of the GPU with this UUID (None: the default one), or None without
        nvidia-smi output. Power: the first of POWER_FIELDS this driver knows. reasons: also the
        clock event reasons (the first of REASON_FIELDS that this driver knows)."""
        fields = [f"clocks.sm,{w}" + (f",{r}" if reasons else "") for w in POWER_FIELDS
                  for r in (REASON_FIELDS if reasons else ("",))]
        cmds = [["nvidia-smi", f"--query-gpu={f}", "--format=csv,noheader,nounits", f"--loop-ms={PERIOD_MS}"]
                for f in fields]
        for attempt in (a for cmd in cmds for a in commands(cmd, uuid)):
            try:
                proc = subprocess.Popen(attempt, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                return None
            sampler = cls(proc)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and not sampler.samples and proc.poll() is None:
                time.sleep(0.05)
            if sampler.samples:
                return sampler
            sampler.close()
        return None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split(",")
            s = parse_line(",".join(parts[:2]))
            if s is not None:
                t = time.monotonic()
                with self.lock:
                    self.samples.append((t, *s))
                    if len(parts) > 2:
                        self.reasons.append((t, parts[2].strip()))

    def window(self, t0: float, t1: float) -> dict:
        with self.lock:
            samples = list(self.samples)
        return window_stats(samples, t0, t1)

    def reasons_in(self, t0: float, t1: float) -> list[str]:
        """The distinct clock event reasons sampled in [t0, t1] (start it with reasons=True)."""
        with self.lock:
            return sorted({r for t, r in self.reasons if t0 <= t <= t1})

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
