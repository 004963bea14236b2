"""Progress of a long command, on a terminal and in a log file.

On a terminal: a click progress bar whose right-hand side reads
``round 120/1000  elapsed 1m40s  remaining ~12m10s  P@5 0.0245`` (durations,
never clock times). When standard output is not a terminal (``nohup``, a batch
job, ``| tee log``) a bar cannot redraw, so one plain line is printed every
``every_percent`` of the work or every ``every_s`` seconds, whichever comes
first, and at the end.

The first step of a fresh process compiles the Numba kernels (seconds to a
minute the first time, cached on disk afterwards); it is announced as such and
left out of the remaining-time estimate, which otherwise would be far too long.
Elapsed times are measured from the moment the object is made, with the clock
the final summary uses (:meth:`Progress.elapsed`), so the figures agree.
"""

from __future__ import annotations

import sys
import time

import click


def duration(seconds: float) -> str:
    """``3h05m``, ``12m10s``, ``45s``: a duration, never to be read as a time of day."""
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Steps ``done+1 .. total`` of a job, shown on a terminal or as log lines.

    Args:
        total: the number of steps of the whole job.
        done: steps already done before this process (a resumed run).
        label: what a step is (``round``, ``run``).
        first_note: said before the first step (e.g. that it compiles kernels);
            None says nothing.
        tty: force terminal (True) or log (False) mode; None asks stdout.
        every_percent, every_s: log-mode cadence.
        clock: time source (tests pass a fake one).
        started: when the job started on ``clock`` (None: now), so that a
            summary printed later can use the same origin.
        parallel: how many steps run at once (a sweep's workers). Their steps
            finish in waves (two runs started together finish seconds apart), so
            the pace between two finishes says nothing of a step's length: with
            parallel > 1 the estimate is the elapsed time per finished step, once
            a whole wave has finished, times the steps left.
    """

    def __init__(self, total: int, done: int = 0, *, label: str = "round",
                 first_note: str | None = None, tty: bool | None = None,
                 every_percent: float = 5.0, every_s: float = 60.0, clock=time.perf_counter,
                 started: float | None = None, parallel: int = 1):
        self.total, self.done, self.label = int(total), int(done), label
        self.parallel = max(1, int(parallel))
        self.clock = clock
        self.started = clock() if started is None else started
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.every_step = max(1, int(self.total * every_percent / 100))
        self.every_s = every_s
        self.step = self.done
        self.metric = ""
        self.last_update = None  # elapsed seconds at the latest update
        self._first_done_at = None  # (step, time) after the first, compiling, step
        self._last_line_at = self.started
        self._last_line_step = self.done
        self.bar = None
        if first_note:
            click.echo(first_note)
        if self.tty:
            self.bar = click.progressbar(length=self.total, label=label + "s",
                                         show_eta=False, show_percent=True,
                                         item_show_func=lambda _: self.status())
            self.bar.__enter__()
            self.bar.update(self.done)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float | None:
        """Seconds left, from the pace of the steps after the first (``parallel`` > 1: of
        every finished step, once ``parallel`` have finished); None before it is known."""
        if self._first_done_at is None:
            return None
        if self.parallel > 1:
            finished = self.step - self.done
            if finished < self.parallel:
                return None
            return self.elapsed() / finished * (self.total - self.step)
        step0, t0 = self._first_done_at
        if self.step <= step0:
            return None
        pace = (self.clock() - t0) / (self.step - step0)
        return pace * (self.total - self.step)

    def status(self) -> str:
        rem = self.remaining()
        parts = [f"{self.label} {self.step}/{self.total}", f"elapsed {duration(self.elapsed())}"]
        if self.step < self.total:
            parts.append(f"remaining ~{duration(rem)}" if rem is not None
                         else "remaining: estimated from the next steps")
        if self.metric:
            parts.append(self.metric)
        return "  ".join(parts)

    def update(self, step: int, metric: str | None = None) -> None:
        """Step ``step`` is done (``metric``: the latest value worth showing, if any)."""
        first = self._first_done_at is None
        self.step = int(step)
        self.last_update = self.elapsed()
        if metric:
            self.metric = metric
        if first:
            self._first_done_at = (self.step, self.clock())
        if self.bar is not None:
            self.bar.update(self.step - self.bar.pos)
            return
        now = self.clock()
        # on multiples of the step (round 50, 100...: where evaluations usually fall)
        crossed = self.step // self.every_step > self._last_line_step // self.every_step
        if first or self.step >= self.total or crossed or now - self._last_line_at >= self.every_s:
            pct = 100.0 * self.step / max(self.total, 1)
            click.echo(f"{self.status()}  ({pct:.0f}%)")
            self._last_line_at, self._last_line_step = now, self.step

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
