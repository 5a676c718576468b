"""Training control: the worker thread, commands and the pause/step state machine."""

from .controller import Controller, State, TrainingTerminated
from .events import EventHub

__all__ = ["Controller", "EventHub", "State", "TrainingTerminated"]
