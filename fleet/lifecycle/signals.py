"""Signals while a guard owns a run: the first SIGINT, SIGTERM or SIGHUP raises Interrupted where
the main thread is; once the teardown has begun (`hold`), any signal is only counted, so that
nothing can cut the teardown short. Used by fleet.lifecycle.guard.Guard, for every backend."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Self

from fleet.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalGuard:
    def __init__(self) -> None:
        self.signals: list[int] = []  # every signal received; 0 marks where the teardown began
        self._saved: dict[int, object] = {}

    def __enter__(self) -> Self:
        self.catch_signals()
        return self

    def catch_signals(self) -> None:
        """From now on signals reach this guard (only the main thread can ask)."""
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._saved[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)
        if len(self.signals) == 1:
            raise Interrupted(signal.Signals(signum).name)

    def hold(self) -> None:
        """The teardown begins: any signal from here on is only counted."""
        self.signals.append(0)

    def release_signals(self) -> None:
        """The handlers as they were before catch_signals."""
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._saved.clear()
