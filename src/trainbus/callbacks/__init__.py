"""Built-in callbacks, one per module."""

from __future__ import annotations

from trainbus.callbacks._run_watch import Health as Health
from trainbus.callbacks._run_watch import JobWatch as JobWatch
from trainbus.callbacks._run_watch import RunWatch as RunWatch
from trainbus.callbacks.checkpoint_saver import CheckpointSaver as CheckpointSaver
from trainbus.callbacks.checkpoint_saver import SaverStatistics as SaverStatistics
from trainbus.callbacks.checkpoint_uploader import CheckpointUploader as CheckpointUploader
from trainbus.callbacks.checkpoint_uploader import (
    CheckpointUploadStatistics as CheckpointUploadStatistics,
)
from trainbus.callbacks.checkpoint_uploader import UploaderStatistics as UploaderStatistics
from trainbus.callbacks.dashboard import Dashboard as Dashboard
from trainbus.callbacks.early_stopper import EarlyStopper as EarlyStopper
from trainbus.callbacks.event_stream import EventStream as EventStream
from trainbus.callbacks.event_stream import StreamBusSnapshot as StreamBusSnapshot
from trainbus.callbacks.event_stream import StreamEvent as StreamEvent
from trainbus.callbacks.event_stream import StreamGap as StreamGap
from trainbus.callbacks.event_stream import StreamItem as StreamItem
from trainbus.callbacks.event_stream import StreamMetrics as StreamMetrics
from trainbus.callbacks.event_stream import StreamOverflowError as StreamOverflowError
from trainbus.callbacks.event_stream import StreamStatistics as StreamStatistics
from trainbus.callbacks.event_stream import Subscription as Subscription
from trainbus.callbacks.grad_monitor import GradMonitor as GradMonitor
from trainbus.callbacks.lr_monitor import LRMonitor as LRMonitor
from trainbus.callbacks.memory_monitor import MemoryMonitor as MemoryMonitor
from trainbus.callbacks.progress_bar import ProgressBar as ProgressBar
from trainbus.callbacks.prometheus import PrometheusMetrics as PrometheusMetrics
from trainbus.callbacks.speed_monitor import SpeedMonitor as SpeedMonitor
from trainbus.callbacks.threshold_stopper import ThresholdStopper as ThresholdStopper

__all__ = (
    "CheckpointSaver",
    "CheckpointUploadStatistics",
    "CheckpointUploader",
    "Dashboard",
    "EarlyStopper",
    "EventStream",
    "GradMonitor",
    "Health",
    "JobWatch",
    "LRMonitor",
    "MemoryMonitor",
    "ProgressBar",
    "PrometheusMetrics",
    "RunWatch",
    "SaverStatistics",
    "SpeedMonitor",
    "StreamBusSnapshot",
    "StreamEvent",
    "StreamGap",
    "StreamItem",
    "StreamMetrics",
    "StreamOverflowError",
    "StreamStatistics",
    "Subscription",
    "ThresholdStopper",
    "UploaderStatistics",
)
